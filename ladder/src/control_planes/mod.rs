//! The control plane's processes in local mode: one, or with
//! `--control-planes N` several replicas on one PostgreSQL database.
//!
//! Each replica has fixed loopback ports of its own (chosen once, so a
//! replica killed or restarted comes back at the same address), and all
//! serve the same `--public-url`: the first replica's URL, the one logical
//! name proofs are bound to and, with `--control-plane-tls`, the name the
//! one certificate (for 127.0.0.1, shared by every replica) is checked
//! against. Routers, members and the ladder's admin calls dial the
//! replicas' own addresses (`--control-plane-endpoint`) and move to the
//! next one when one does not answer. They share the key-encryption key
//! and the admin token; the first replica starts (and migrates an empty
//! database) before the others.
//!
//! The hold's replica events act on them here: SIGKILL and start again,
//! SIGTERM and start again, SIGSTOP with a timed SIGCONT; [`probe`] reads
//! them (Watch streams, memory, CPU).

pub mod probe;

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Child;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::binaries::Binaries;
use crate::children;
use crate::config::LocalConfig;
use crate::error::{LadderError, Result};
use crate::placement::{self, Placement};
use crate::ports;

/// Grace for a replica to exit after SIGTERM (or SIGKILL) before the next signal.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// One control-plane process.
pub struct ControlPlaneProc {
    /// `cp0`, `cp1`…
    pub name: String,
    child: Child,
    args: Vec<String>,
    log: PathBuf,
    /// gRPC address.
    pub grpc: SocketAddr,
    /// HTTP address (`/readyz`, `/metrics`, `/info`).
    pub http: SocketAddr,
    /// Times it was started.
    pub starts: u32,
    /// While SIGSTOPped: when its SIGCONT is due.
    stopped_until: Option<Instant>,
    /// The timer that sends that SIGCONT.
    resume: Option<JoinHandle<()>>,
}

impl Drop for ControlPlaneProc {
    fn drop(&mut self) {
        // The process is killed on drop; its timer must not signal the pid after.
        if let Some(t) = self.resume.take() {
            t.abort();
        }
    }
}

impl ControlPlaneProc {
    /// Its pid (None once it has exited and was reaped).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Its gRPC URL.
    pub fn url(&self, tls: bool) -> String {
        let scheme = if tls { "https" } else { "http" };
        format!("{scheme}://{}", self.grpc)
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }
}

/// Every replica, and what starting one again needs.
pub struct ControlPlanes {
    bin: PathBuf,
    env: Vec<(String, String)>,
    prefix: Vec<OsString>,
    ready_deadline: Duration,
    public_url: String,
    tls: bool,
    /// The replicas, `cp0` first.
    pub replicas: Vec<ControlPlaneProc>,
}

impl ControlPlanes {
    /// Starts `--control-planes` replicas (one with `place`, on its host's
    /// fixed ports), each waited on at its `/readyz`; returns them and the
    /// certificate they serve, if TLS.
    pub async fn start(
        bins: &Binaries,
        cfg: &LocalConfig,
        dir: &Path,
        place: Option<&Placement>,
        admin_file: &Path,
    ) -> Result<(Self, Option<PathBuf>)> {
        let n = cfg.control_planes.max(1) as usize;
        if n > 1 && place.is_some() {
            return Err(LadderError::Args(
                "--control-planes with --hosts: the control plane has one host".into(),
            ));
        }
        let addrs = (0..n)
            .map(|_| match place {
                Some(p) => Ok((
                    p.control_plane.at(placement::CONTROL_PLANE_GRPC_PORT),
                    p.control_plane.at(placement::CONTROL_PLANE_HTTP_PORT),
                )),
                None => Ok((ports::free_addr()?, ports::free_addr()?)),
            })
            .collect::<Result<Vec<_>>>()?;
        let tls = if cfg.control_plane_tls {
            Some(self_signed(dir, addrs[0].0.ip())?)
        } else {
            None
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let public_url = format!("{scheme}://{}", addrs[0].0);
        let common = common_args(
            cfg,
            dir,
            &public_url,
            tls.as_ref(),
            place.is_some(),
            admin_file,
        )?;
        let mut set = Self {
            bin: bins.control_plane.clone(),
            env: cfg.control_plane_env.clone(),
            prefix: place
                .map(|p| p.control_plane.prefix.clone())
                .unwrap_or_default(),
            ready_deadline: Duration::from_secs(cfg.ready_deadline_secs),
            public_url,
            tls: tls.is_some(),
            replicas: Vec::with_capacity(n),
        };
        for (i, (grpc, http)) in addrs.into_iter().enumerate() {
            let mut args = vec![
                "--grpc-addr".to_string(),
                grpc.to_string(),
                "--http-addr".to_string(),
                http.to_string(),
            ];
            args.extend(common.iter().cloned());
            let log = dir.join(if i == 0 {
                "control-plane.log".to_string()
            } else {
                format!("control-plane-{i}.log")
            });
            let child = set.spawn(&args, &log)?;
            let mut cp = ControlPlaneProc {
                name: format!("cp{i}"),
                child,
                args,
                log,
                grpc,
                http,
                starts: 1,
                stopped_until: None,
                resume: None,
            };
            wait_ready(set.ready_deadline, &mut cp).await?;
            set.replicas.push(cp);
        }
        Ok((set, tls.map(|(cert, _)| cert)))
    }

    fn spawn(&self, args: &[String], log: &Path) -> Result<Child> {
        children::spawn_with_env(&self.prefix, &self.bin, args, &self.env, log)
    }

    /// The one URL every replica serves (`--public-url`).
    pub fn url(&self) -> String {
        self.public_url.clone()
    }

    /// Whether they serve TLS.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The addresses to dial as `--control-plane-endpoint`: every
    /// replica's, or none with one (it is the URL itself).
    pub fn endpoints(&self) -> Vec<String> {
        if self.replicas.len() < 2 {
            return Vec::new();
        }
        self.replicas.iter().map(|r| r.url(self.tls)).collect()
    }

    /// Every replica's own URL, `cp0` first.
    pub fn addresses(&self) -> Vec<String> {
        self.replicas.iter().map(|r| r.url(self.tls)).collect()
    }

    /// The first replica.
    pub fn first(&self) -> &ControlPlaneProc {
        &self.replicas[0]
    }

    /// Whether replica `i` is SIGSTOPped now.
    pub fn is_stopped(&self, i: usize) -> bool {
        self.stopped_until(i).is_some()
    }

    /// When replica `i`'s SIGCONT is due, while it is stopped.
    pub fn stopped_until(&self, i: usize) -> Option<Instant> {
        self.replicas
            .get(i)
            .and_then(|r| r.stopped_until)
            .filter(|t| *t > Instant::now())
    }

    /// Replicas neither stopped nor exited, by index.
    pub fn live(&mut self) -> Vec<usize> {
        let now = Instant::now();
        let mut live = Vec::new();
        for (i, r) in self.replicas.iter_mut().enumerate() {
            let stopped = r.stopped_until.is_some_and(|t| t > now);
            if !stopped && matches!(r.child.try_wait(), Ok(None)) {
                live.push(i);
            }
        }
        live
    }

    fn replica(&mut self, i: usize) -> Result<&mut ControlPlaneProc> {
        self.replicas
            .get_mut(i)
            .ok_or_else(|| LadderError::Args(format!("no control-plane replica {i}")))
    }

    /// Starts replica `i` again with its arguments and ports once its old
    /// process is gone; returns when it answered `/readyz`.
    async fn start_again(&mut self, i: usize) -> Result<()> {
        let (args, log) = {
            let r = self.replica(i)?;
            (r.args.clone(), r.log.clone())
        };
        let child = self.spawn(&args, &log)?;
        let deadline = self.ready_deadline;
        let r = &mut self.replicas[i];
        // The old process has exited: dropping its handle signals nothing.
        r.child = child;
        r.starts += 1;
        r.stopped_until = None;
        wait_ready(deadline, r).await.map(drop)
    }

    /// SIGKILLs replica `i` and starts it again at once; returns the time
    /// from the SIGKILL until it was ready again.
    pub async fn kill_and_start(&mut self, i: usize) -> Result<Duration> {
        let t0 = Instant::now();
        let r = self.replica(i)?;
        r.child
            .start_kill()
            .map_err(|e| LadderError::io(format!("killing {}", r.name), e))?;
        let _ = tokio::time::timeout(STOP_GRACE, r.child.wait()).await;
        self.start_again(i).await?;
        Ok(t0.elapsed())
    }

    /// SIGTERMs replica `i` (SIGKILL after the grace) and starts it again;
    /// returns the time until it exited and then until it was ready.
    pub async fn terminate_and_start(&mut self, i: usize) -> Result<(Duration, Duration)> {
        let t0 = Instant::now();
        children::stop(&mut self.replica(i)?.child, STOP_GRACE).await;
        let exited = t0.elapsed();
        let t1 = Instant::now();
        self.start_again(i).await?;
        Ok((exited, t1.elapsed()))
    }

    /// SIGSTOPs replica `i` and has a timer SIGCONT it after `d`.
    pub fn stop_for(&mut self, i: usize, d: Duration) -> Result<()> {
        let r = self.replica(i)?;
        let pid = r
            .pid()
            .ok_or_else(|| LadderError::Process(format!("{} has exited", r.name)))?;
        children::signal(pid, libc::SIGSTOP)?;
        let until = Instant::now() + d;
        r.stopped_until = Some(until);
        if let Some(old) = r.resume.take() {
            old.abort();
        }
        r.resume = Some(tokio::spawn(async move {
            tokio::time::sleep_until(until).await;
            if let Err(e) = children::signal(pid, libc::SIGCONT) {
                eprintln!("\rladder: SIGCONT to control plane {pid}: {e}");
            }
        }));
        Ok(())
    }

    /// The first replica that exited without the ladder stopping it: its
    /// name, pid and log. Reaps it.
    pub fn exited_unexpectedly(&mut self) -> Option<(String, Option<u32>, PathBuf)> {
        let n = self.replicas.len();
        self.replicas.iter_mut().find_map(|r| {
            let pid = r.child.id();
            (!matches!(r.child.try_wait(), Ok(None))).then(|| {
                let name = if n == 1 {
                    "the control plane".to_string()
                } else {
                    format!("control plane {}", r.name)
                };
                (name, pid, r.log.clone())
            })
        })
    }

    /// Stops replica `i` (SIGTERM) and starts it again on the same ports
    /// and database; returns the time until it was ready again.
    pub async fn restart(&mut self, i: usize) -> Result<Duration> {
        let start = Instant::now();
        self.terminate_and_start(i).await?;
        Ok(start.elapsed())
    }

    /// Stops every replica: a stopped one is continued first (a frozen
    /// process would take its SIGTERM only after the grace).
    pub async fn shutdown(&mut self) {
        for r in &mut self.replicas {
            if let Some(t) = r.resume.take() {
                t.abort();
            }
            if r.stopped_until.take().is_some()
                && let Some(pid) = r.pid()
            {
                let _ = children::signal(pid, libc::SIGCONT);
            }
            children::stop(&mut r.child, STOP_GRACE).await;
        }
    }
}

/// Waits until `cp` answers `/readyz` (within `deadline`).
async fn wait_ready(deadline: Duration, cp: &mut ControlPlaneProc) -> Result<Duration> {
    let what = if cp.starts == 1 && cp.name == "cp0" {
        "control plane".to_string()
    } else {
        format!("control plane {} (start {})", cp.name, cp.starts)
    };
    children::wait_ready(&what, &mut cp.child, cp.http, deadline, &cp.log).await
}

/// What every replica's command line shares after its own addresses: the
/// public URL, the database (the work dir's SQLite file unless
/// `--control-plane-db`) with one key-encryption key, the admin token,
/// TLS, and the operator's `--control-plane-arg`s last.
fn common_args(
    cfg: &LocalConfig,
    dir: &Path,
    public_url: &str,
    tls: Option<&(PathBuf, PathBuf)>,
    off_loopback: bool,
    admin_file: &Path,
) -> Result<Vec<String>> {
    let mut args = vec![
        "--public-url".to_string(),
        public_url.to_string(),
        "--db".to_string(),
        cfg.control_plane_db
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", dir.join("control-plane.db").display())),
        "--admin-token-file".to_string(),
        admin_file.display().to_string(),
    ];
    if cfg.control_plane_db.is_some() {
        // A database other than the work dir's SQLite file needs its
        // key-encryption key given (SQLite keeps one beside its file);
        // every replica must hold the same one.
        let kek =
            children::write_secret(&dir.join("control-plane.kek"), &children::random_hex(32))?;
        args.extend([
            "--key-encryption-key-file".to_string(),
            kek.display().to_string(),
        ]);
    }
    if let Some(ttl) = cfg.credential_ttl_secs {
        args.extend(["--credential-ttl-secs".to_string(), ttl.to_string()]);
    }
    if tls.is_none() && off_loopback {
        // Plaintext off loopback: the testbed's own private network.
        args.push("--insecure".to_string());
    }
    if let Some((cert, key)) = tls {
        args.extend([
            "--tls-cert".to_string(),
            cert.display().to_string(),
            "--tls-key".to_string(),
            key.display().to_string(),
        ]);
    }
    // The ladder measures a mesh where every member may call every
    // service, unless its control-plane arguments name a policy.
    if !cfg
        .control_plane_args
        .iter()
        .any(|a| a.starts_with("--policy"))
    {
        args.push("--policy-allow-all".to_string());
    }
    args.extend(cfg.control_plane_args.iter().cloned());
    Ok(args)
}

/// Writes a self-signed certificate for 127.0.0.1, localhost and `ip` (the
/// control plane's address) and its key (0600) into `dir`; returns their paths.
fn self_signed(dir: &Path, ip: std::net::IpAddr) -> Result<(PathBuf, PathBuf)> {
    let mut names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    if !ip.is_loopback() {
        names.push(ip.to_string());
    }
    let cert = rcgen::generate_simple_self_signed(names)
        .map_err(|e| LadderError::Args(format!("making a TLS certificate: {e}")))?;
    let cert_path = dir.join("control-plane-tls.crt");
    std::fs::write(&cert_path, cert.cert.pem())
        .map_err(|e| LadderError::io(format!("writing {}", cert_path.display()), e))?;
    let key_path = children::write_secret(
        &dir.join("control-plane-tls.key"),
        &cert.key_pair.serialize_pem(),
    )?;
    Ok((cert_path, key_path))
}
