//! `agentmesh-ladder testbed`: the mesh of a `--hosts` run, started on
//! namespace hosts and kept up for `agentmesh-ladder remote` runs, the path
//! a run on real VMs takes (issue 19).
//!
//! It builds the hosts ([`Layout`]: the control plane's, one per router,
//! the member hosts, NATs when asked), starts the real control plane and
//! routers on them ([`LocalMesh::start_placed`], as local mode does), then
//! writes `WORK_DIR/testbed.json` ([`TestbedFile`]) and waits: until SIGINT
//! or SIGTERM (exit 0), `--max-up-secs`, or a mesh program exiting on its
//! own (exit non-zero, naming it). Then it stops the mesh, removes the
//! namespaces with every process in them, and checks none is left.
//!
//! The mesh's files go to `WORK_DIR/mesh`, so a remote run given the
//! testbed's own work dir clears nothing of it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::Instant;

use super::build::{HostsTestbed, Layout};
use super::testbed_file::{FILE_NAME, TestbedFile};
use super::{HostsConfig, MemberNat};
use crate::binaries::Binaries;
use crate::config::{FleetConfig, LocalConfig};
use crate::error::{LadderError, Result};
use crate::mesh::LocalMesh;

/// The mesh's subdirectory of the work dir.
pub const MESH_DIR: &str = "mesh";
/// Default `--members`: the full-size ladder (3 providers and 10 steps of 1,000).
pub const DEFAULT_MEMBERS: u64 = 10_003;
/// How often the testbed checks that the control plane and routers still run.
const CHECK_PERIOD: Duration = Duration::from_secs(1);
/// Deadline of the mesh's shutdown (each program has 30 s after SIGTERM,
/// then SIGKILL); past it the namespaces are removed with what is left.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(180);

/// The flags of `agentmesh-ladder testbed`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct TestbedConfig {
    /// Hosts to build (network namespaces; needs root): one for the control
    /// plane, one per router (`--routers`), the rest member hosts for
    /// `agentmesh-ladder remote` runs. At most 250.
    #[arg(long)]
    pub hosts: usize,
    /// Put each member host behind a NAT gateway of its own (`eim`:
    /// endpoint-independent mapping; `symmetric`: endpoint-dependent,
    /// random ports), or none.
    #[arg(long = "member-nat", value_enum, default_value_t = MemberNat::None)]
    pub member_nat: MemberNat,
    /// Members the remote runs will enroll in all, members (providers +
    /// step × steps × rounds + burst of each run); the member token allows
    /// this many plus a tenth and 100 more. Default 10003.
    #[arg(long, default_value_t = DEFAULT_MEMBERS)]
    pub members: u64,
    /// Directory for `testbed.json` and, under `mesh/`, the mesh's data,
    /// tokens, certificate and logs (an earlier run's database and logs
    /// there are removed first; router keys are kept).
    #[arg(long)]
    pub work_dir: PathBuf,
    /// Stop as on SIGTERM this many seconds after the start, seconds (0 =
    /// no limit: until SIGINT or SIGTERM). Default 0.
    #[arg(long, default_value_t = 0)]
    pub max_up_secs: u64,
    /// The mesh: routers, extra program arguments, readiness deadline, TLS.
    #[command(flatten)]
    pub mesh: LocalConfig,
}

/// Member token uses for `members` members: a tenth and 100 more for
/// retries and restarted members.
pub fn token_uses(members: u64) -> u64 {
    members.saturating_add(members / 10).saturating_add(100)
}

/// The hosts to build, or why the flags do not make a testbed.
fn layout(cfg: &TestbedConfig) -> Result<Layout> {
    if cfg.mesh.routers == 0 {
        return Err(LadderError::Args("--routers must be at least 1".into()));
    }
    if cfg.mesh.restart_routers {
        return Err(LadderError::Args(
            "--restart-routers: the testbed kills and drains no router (remote mode cannot); \
             a router that exits stops the testbed"
                .into(),
        ));
    }
    if cfg.members == 0 {
        return Err(LadderError::Args("--members must be at least 1".into()));
    }
    super::check(&cfg.mesh, &FleetConfig::default())?;
    let hosts = HostsConfig {
        hosts: Some(cfg.hosts),
        member_nat: cfg.member_nat,
    };
    let member_hosts = hosts
        .member_hosts(cfg.mesh.routers)?
        .ok_or_else(|| LadderError::Args("--hosts is required".into()))?;
    Ok(Layout {
        hosts: cfg.hosts,
        routers: cfg.mesh.routers,
        member_hosts,
        member_nat: cfg.member_nat,
    })
}

/// SIGINT, SIGTERM and `--max-up-secs`.
struct Stop {
    int: Signal,
    term: Signal,
    until: Option<Instant>,
}

impl Stop {
    fn new(max_up_secs: u64) -> Result<Self> {
        let install = |kind: SignalKind| {
            signal(kind).map_err(|e| LadderError::io("installing a signal handler", e))
        };
        Ok(Self {
            int: install(SignalKind::interrupt())?,
            term: install(SignalKind::terminate())?,
            until: (max_up_secs > 0).then(|| Instant::now() + Duration::from_secs(max_up_secs)),
        })
    }

    /// Waits for the first of them; says which.
    async fn wait(&mut self) -> &'static str {
        let until = self.until;
        let deadline = async move {
            match until {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
            () = deadline => "--max-up-secs",
        }
    }
}

fn interrupted(why: &str) -> LadderError {
    LadderError::Process(format!(
        "{why} before the testbed was up; its hosts are removed"
    ))
}

/// Runs the testbed until it is stopped (see the module docs).
pub async fn run(cfg: TestbedConfig) -> Result<()> {
    // First, so a signal during the start stops the start instead of
    // killing the process with its namespaces in place.
    let mut stop = Stop::new(cfg.max_up_secs)?;
    let layout = layout(&cfg)?;
    let uses = token_uses(cfg.members);
    let bins = Binaries::locate()?;
    let file = prepare(&cfg.work_dir).await?;
    let cap = cfg
        .mesh
        .cpu_quota
        .map(crate::cgroup::CpuCap::create)
        .transpose()?;
    let result = serve(&cfg, layout, bins, uses, &file, &mut stop).await;
    if let Some(cap) = cap {
        let r = cap.finish();
        eprintln!(
            "testbed: the mesh ran capped at {} cores: throttled in {} of {} periods ({:.1} s)",
            r.cores, r.throttled_periods, r.periods, r.throttled_secs
        );
    }
    result
}

/// Makes the work dir and its `mesh/`, refuses one a live testbed serves,
/// and clears an earlier run's file, database and logs; returns the
/// file's path.
async fn prepare(work_dir: &Path) -> Result<PathBuf> {
    let mesh = work_dir.join(MESH_DIR);
    std::fs::create_dir_all(&mesh)
        .map_err(|e| LadderError::io(format!("creating {}", mesh.display()), e))?;
    let file = work_dir.join(FILE_NAME);
    if let Some(pid) = serving_pid(&file)
        && pid != std::process::id()
        && Path::new("/proc").join(pid.to_string()).exists()
    {
        return Err(LadderError::Args(format!(
            "{} is served by a running testbed (pid {pid}): stop it or use another --work-dir",
            file.display()
        )));
    }
    match std::fs::remove_file(&file) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(LadderError::io(format!("removing {}", file.display()), e)),
    }
    crate::workdir::clear_previous_run(&mesh).await?;
    Ok(file)
}

/// The `pid` of an existing `testbed.json`.
fn serving_pid(file: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(file).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    u32::try_from(v.get("pid")?.as_u64()?).ok()
}

/// Builds the hosts, runs the mesh on them until stopped, removes them and
/// checks that no namespace of the testbed is left.
async fn serve(
    cfg: &TestbedConfig,
    layout: Layout,
    bins: Binaries,
    uses: u64,
    file: &Path,
    stop: &mut Stop,
) -> Result<()> {
    let tb = tokio::select! {
        r = layout.build() => r?,
        why = stop.wait() => return Err(interrupted(why)),
    };
    let prefix = tb.placement.record.prefix.clone();
    eprintln!("testbed: {}", tb.placement.record.summary());
    let result = up(cfg, &tb, bins, uses, file, stop).await;
    // The driver and then the namespaces, with whatever still runs in them.
    drop(tb);
    let left = namespaces_of(&prefix);
    match (result, left.is_empty()) {
        (Ok(()), true) => {
            eprintln!("testbed: stopped; no namespace of {prefix} is left");
            Ok(())
        }
        (Ok(()), false) => Err(LadderError::Process(format!(
            "namespaces left after the testbed: {left:?}"
        ))),
        (Err(e), true) => Err(e),
        (Err(e), false) => Err(LadderError::Process(format!(
            "{e}; namespaces left after the testbed: {left:?}"
        ))),
    }
}

/// Namespaces whose name starts with `prefix`.
pub fn namespaces_of(prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(agentmesh_netns::sweep::NETNS_DIR)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Starts the mesh, writes the file, holds until stopped, then stops the
/// mesh and removes the file.
async fn up(
    cfg: &TestbedConfig,
    tb: &HostsTestbed,
    bins: Binaries,
    uses: u64,
    file: &Path,
    stop: &mut Stop,
) -> Result<()> {
    let dir = cfg.work_dir.join(MESH_DIR);
    let place = tb.placement.clone();
    let local = cfg.mesh.clone();
    let start = tb
        .driver
        .run(async move { LocalMesh::start_placed(bins, local, &dir, uses, Some(place)).await });
    let mut mesh = tokio::select! {
        r = start => r?,
        why = stop.wait() => return Err(interrupted(why)),
    };
    let result = hold(cfg, tb, &mut mesh, uses, file, stop).await;
    let _ = std::fs::remove_file(file);
    eprintln!("testbed: stopping the mesh");
    let stopped = tokio::time::timeout(
        SHUTDOWN_DEADLINE,
        tb.driver.run(async move {
            mesh.shutdown().await;
            Ok(())
        }),
    )
    .await;
    if stopped.is_err() {
        eprintln!(
            "testbed: the mesh did not stop within {SHUTDOWN_DEADLINE:?}; removing its hosts kills it"
        );
    }
    result
}

/// Writes the file and waits for a stop or a mesh program's exit.
async fn hold(
    cfg: &TestbedConfig,
    tb: &HostsTestbed,
    mesh: &mut LocalMesh,
    uses: u64,
    file: &Path,
    stop: &mut Stop,
) -> Result<()> {
    let record = TestbedFile::new(tb, mesh, cfg.members, uses, cfg.mesh.cpu_quota).await?;
    record.write(file)?;
    eprintln!("{}", record.summary(file));
    let mut tick = tokio::time::interval(CHECK_PERIOD);
    loop {
        tokio::select! {
            why = stop.wait() => {
                eprintln!("testbed: {why}: stopping the mesh and removing the hosts");
                return Ok(());
            }
            _ = tick.tick() => {
                if let Some(dead) = exited_program(mesh) {
                    eprintln!("testbed: a mesh program exited: stopping the testbed");
                    return Err(LadderError::Process(dead));
                }
            }
        }
    }
}

/// The first mesh program that exited on its own, with its log's last lines.
fn exited_program(mesh: &mut LocalMesh) -> Option<String> {
    let (name, pid, log) = mesh.exited_unexpectedly()?;
    Some(format!(
        "{name} (pid {}) exited unexpectedly, so the testbed stopped; last lines of {}:\n{}",
        pid.map_or_else(|| "?".to_string(), |p| p.to_string()),
        log.display(),
        crate::children::tail(&log)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        testbed: TestbedConfig,
    }

    fn parse(args: &[&str]) -> TestbedConfig {
        Cli::try_parse_from(std::iter::once("testbed").chain(args.iter().copied()))
            .expect("parses")
            .testbed
    }

    #[test]
    fn the_flags_make_a_layout_or_say_why_not() {
        let cfg = parse(&[
            "--hosts",
            "6",
            "--routers",
            "4",
            "--member-nat",
            "eim",
            "--control-plane-tls",
            "--work-dir",
            "/tmp/x",
            "--router-arg=--memory-limit-bytes=1",
        ]);
        assert_eq!(cfg.members, DEFAULT_MEMBERS);
        assert!(cfg.mesh.control_plane_tls);
        assert_eq!(cfg.mesh.router_args, ["--memory-limit-bytes=1"]);
        let l = layout(&cfg).expect("layout");
        assert_eq!((l.hosts, l.routers, l.member_hosts), (6, 4, 1));
        assert_eq!(l.member_nat, MemberNat::Eim);

        let e = layout(&parse(&[
            "--hosts",
            "5",
            "--routers",
            "4",
            "--work-dir",
            "x",
        ]))
        .expect_err("no member host");
        assert!(e.to_string().contains("at least 6"), "{e}");
        let e = layout(&parse(&[
            "--hosts",
            "6",
            "--restart-routers",
            "--work-dir",
            "x",
        ]))
        .expect_err("restart");
        assert!(e.to_string().contains("--restart-routers"), "{e}");
        let e = layout(&parse(&[
            "--hosts",
            "6",
            "--control-plane-db",
            "postgres://x@127.0.0.1/db",
            "--work-dir",
            "x",
        ]))
        .expect_err("db");
        assert!(e.to_string().contains("--control-plane-db"), "{e}");
        assert!(Cli::try_parse_from(["testbed", "--work-dir", "x"]).is_err());
        assert!(Cli::try_parse_from(["testbed", "--hosts", "4"]).is_err());
    }

    #[test]
    fn token_uses_leave_headroom() {
        assert_eq!(token_uses(10_003), 10_003 + 1_000 + 100);
        assert_eq!(token_uses(0), 100);
        assert_eq!(token_uses(u64::MAX), u64::MAX);
    }
}
