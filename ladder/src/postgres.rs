//! `--control-plane-store postgres`: a throwaway PostgreSQL server the
//! ladder starts for its control plane and removes afterwards.
//!
//! The cluster lives in `agentmesh-ladder-pg.<pid>` under the system temp
//! dir (not the work dir: the server's user must be able to reach it).
//! PostgreSQL refuses to run as root, so a root ladder runs `initdb` and
//! the server as the `postgres` user, in a directory that user owns.
//! `initdb` sets a random password for the `postgres` role (SCRAM over
//! TCP, peer on the Unix socket in the cluster dir, which only that user
//! can enter); the server listens on 127.0.0.1 only, on a free port; the
//! ladder creates the database [`DATABASE`] and hands the control plane
//! the URL, the password in `PGPASSWORD` (never on a command line).
//! Durability settings stay PostgreSQL's defaults: the ladder measures the
//! store as an operator would run it.
//!
//! The server is a child of the ladder (not daemonised by `pg_ctl`), its
//! output appended to `postgres.log` in the work dir. [`Postgres::stop`]
//! asks for a fast shutdown and waits [`STOP_GRACE`], then an immediate
//! one, then SIGKILL, and removes the cluster dir; dropping a [`Postgres`]
//! (an error, a panic, SIGINT) does the immediate shutdown and removal. A
//! run killed outright leaves its cluster (and its server) behind: the next
//! PostgreSQL run stops that server and removes the dir ([`remove_leftovers`]),
//! as the cgroup and namespace cleanup of `--cpu-quota` and `--hosts` do.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::children;
use crate::error::{LadderError, Result};

pub mod psql;

/// Name prefix of the ladder's cluster directories (`<prefix><pid>`).
pub const DIR_PREFIX: &str = "agentmesh-ladder-pg.";
/// The database the control plane gets.
pub const DATABASE: &str = "agentmesh";
/// The superuser role `initdb` creates, and the OS user a root ladder runs the server as.
const SERVER_USER: &str = "postgres";
/// PostgreSQL major versions looked for under `/usr/lib/postgresql/<v>/bin`, newest first.
const VERSIONS: [&str; 3] = ["17", "16", "15"];
/// Period between readiness polls.
const POLL: Duration = Duration::from_millis(200);
/// Deadline of one `pg_isready`, `createdb` or `--version`.
const TOOL_TIMEOUT: Duration = Duration::from_secs(30);
/// Grace for a fast shutdown before an immediate one, and for that before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(30);
/// Wait for a left-over server, or a dropped one, to exit after each signal.
const EXIT_WAIT: Duration = Duration::from_secs(10);

/// Which store the ladder's control plane uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    /// SQLite in the work dir (`control-plane.db`), or `--control-plane-db`.
    #[default]
    Sqlite,
    /// A PostgreSQL server the ladder starts (and removes) for the run.
    Postgres,
}

/// The store the run's control plane used, for the report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StoreRecord {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// The engine's version (SQLite: from the database file's header, the
    /// library that last wrote it; PostgreSQL: the server's `--version`),
    /// None where the ladder cannot tell (a database it did not start).
    pub version: Option<String>,
    /// Whether the ladder started the server (`--control-plane-store postgres`).
    pub started_by_ladder: bool,
    /// The server's binaries (a server the ladder started).
    pub bin_dir: Option<String>,
    /// The cluster directory (removed when the run ended).
    pub cluster_dir: Option<String>,
}

impl StoreRecord {
    /// One line for the markdown report.
    pub fn summary(&self) -> String {
        let name = match self.backend.as_str() {
            "postgres" => "PostgreSQL",
            "sqlite" => "SQLite",
            other => other,
        };
        let version = self.version.as_deref().unwrap_or("(version unknown)");
        let how = match (&self.bin_dir, self.started_by_ladder) {
            (Some(b), true) => format!(", started by the ladder from {b}"),
            _ => String::new(),
        };
        format!("Control-plane store: {name} {version}{how}.")
    }
}

/// The SQLite library version that last wrote the database file at `path`
/// (bytes 96..100 of its header, `SQLITE_VERSION_NUMBER`), e.g. `3.46.0`.
pub fn sqlite_file_version(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut header = [0u8; 100];
    std::fs::File::open(path)
        .ok()?
        .read_exact(&mut header)
        .ok()?;
    if !header.starts_with(b"SQLite format 3\0") {
        return None;
    }
    let n = u32::from_be_bytes([header[96], header[97], header[98], header[99]]);
    (n > 0).then(|| format!("{}.{}.{}", n / 1_000_000, n / 1_000 % 1_000, n % 1_000))
}

/// The newest `/usr/lib/postgresql/<v>/bin` holding `initdb` (as
/// `.ci/postgres.sh` finds the Debian packages' binaries).
pub fn default_bin_dir() -> Option<PathBuf> {
    VERSIONS
        .iter()
        .map(|v| PathBuf::from(format!("/usr/lib/postgresql/{v}/bin")))
        .find(|d| d.join("initdb").is_file())
}

/// Why this machine cannot start a server from `bin_dir` (None: it can).
pub fn unavailable(bin_dir: Option<&Path>) -> Option<String> {
    let Some(dir) = bin_dir.map(Path::to_path_buf).or_else(default_bin_dir) else {
        return Some(format!(
            "no PostgreSQL binaries (initdb) under /usr/lib/postgresql/{{{}}}/bin; \
             install postgresql or pass --postgres-bin-dir",
            VERSIONS.join(",")
        ));
    };
    for tool in ["initdb", "postgres", "pg_isready", "createdb"] {
        if !dir.join(tool).is_file() {
            return Some(format!("{} has no {tool}", dir.display()));
        }
    }
    server_owner().err().map(|e| e.to_string())
}

/// The uid and gid the server runs as: the `postgres` user's when the
/// ladder is root (PostgreSQL refuses root), else None (the ladder's own).
fn server_owner() -> Result<Option<(u32, u32)>> {
    // /proc/self belongs to the process's effective uid.
    let euid = std::fs::metadata("/proc/self")
        .map_err(|e| LadderError::io("reading /proc/self", e))?
        .uid();
    if euid != 0 {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd")
        .map_err(|e| LadderError::io("reading /etc/passwd", e))?;
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 3 && f[0] == SERVER_USER)
                .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
                .flatten()
        })
        .map(Some)
        .ok_or_else(|| {
            LadderError::Args(format!(
                "--control-plane-store postgres as root needs a '{SERVER_USER}' user to run \
                 the server (PostgreSQL refuses root); install postgresql or run as another user"
            ))
        })
}

/// A running server of the ladder's; see the module docs.
#[derive(Debug)]
pub struct Postgres {
    dir: PathBuf,
    child: Option<Child>,
    bin_dir: PathBuf,
    port: u16,
    password: String,
    version: String,
    log: PathBuf,
}

impl Postgres {
    /// Starts a server under the system temp dir, output to `log`, ready
    /// (and its database created) within `deadline`.
    pub async fn start(bin_dir: Option<&Path>, log: &Path, deadline: Duration) -> Result<Self> {
        Self::start_in(&std::env::temp_dir(), bin_dir, log, deadline).await
    }

    /// [`Postgres::start`] with the cluster dir under `parent`.
    pub async fn start_in(
        parent: &Path,
        bin_dir: Option<&Path>,
        log: &Path,
        deadline: Duration,
    ) -> Result<Self> {
        if let Some(why) = unavailable(bin_dir) {
            return Err(LadderError::Args(format!(
                "--control-plane-store postgres: {why}"
            )));
        }
        let bin_dir = bin_dir
            .map(Path::to_path_buf)
            .or_else(default_bin_dir)
            .ok_or_else(|| LadderError::Args("no PostgreSQL binaries".into()))?;
        let alive = |pid: u32| Path::new(&format!("/proc/{pid}")).exists();
        for name in remove_leftovers(parent, alive) {
            eprintln!("ladder: removed PostgreSQL cluster {name} left by a run that is gone");
        }
        let owner = server_owner()?;
        let dir = parent.join(format!("{DIR_PREFIX}{}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| LadderError::io(format!("creating {}", dir.display()), e))?;
        let password = children::random_hex(24);
        let mut pg = Self {
            dir,
            child: None,
            bin_dir,
            port: 0,
            password,
            version: String::new(),
            log: log.to_path_buf(),
        };
        // From here on, a failure drops `pg`, which removes the dir.
        pg.init(owner, deadline).await?;
        Ok(pg)
    }

    async fn init(&mut self, owner: Option<(u32, u32)>, deadline: Duration) -> Result<()> {
        let started = Instant::now();
        let pwfile = self.dir.join("pwfile");
        write_owned(&pwfile, &self.password, owner)?;
        if let Some((uid, gid)) = owner {
            chown(&self.dir, uid, gid)?;
        }
        let data = self.dir.join("data");
        let mut initdb = self.command("initdb", owner)?;
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", SERVER_USER, "-E", "UTF8", "--no-sync"])
            .args(["--auth-host=scram-sha-256", "--auth-local=peer"])
            .arg(format!("--pwfile={}", pwfile.display()));
        run(&mut initdb, "initdb", deadline, &self.log).await?;
        let _ = std::fs::remove_file(&pwfile);

        self.port = crate::ports::free_port()?;
        self.spawn_server(owner)?;
        self.wait_ready(deadline.saturating_sub(started.elapsed()))
            .await?;

        let mut createdb = self.command("createdb", None)?;
        createdb
            .args(["-h", "127.0.0.1", "-U", SERVER_USER, "-p"])
            .arg(self.port.to_string())
            .arg(DATABASE)
            .env("PGPASSWORD", &self.password);
        run(&mut createdb, "createdb", TOOL_TIMEOUT, &self.log).await?;

        let out = tokio::time::timeout(
            TOOL_TIMEOUT,
            Command::new(self.bin_dir.join("postgres"))
                .arg("--version")
                .output(),
        )
        .await
        .map_err(|_| LadderError::Process("postgres --version did not answer".into()))?
        .map_err(|e| LadderError::io("running postgres --version", e))?;
        // "postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)"
        let text = String::from_utf8_lossy(&out.stdout);
        self.version = text
            .split_once(") ")
            .map_or(text.trim(), |(_, v)| v.trim())
            .to_string();
        eprintln!(
            "ladder: PostgreSQL {} on 127.0.0.1:{} (cluster {}, log {})",
            self.version,
            self.port,
            self.dir.display(),
            self.log.display()
        );
        Ok(())
    }

    /// Starts the postmaster on the cluster's data and port.
    fn spawn_server(&mut self, owner: Option<(u32, u32)>) -> Result<()> {
        let mut server = self.command("postgres", owner)?;
        server
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-c", "listen_addresses=127.0.0.1"])
            .arg("-c")
            .arg(format!("port={}", self.port))
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.display()))
            .kill_on_drop(true);
        self.child = Some(
            server
                .spawn()
                .map_err(|e| LadderError::io("starting postgres", e))?,
        );
        Ok(())
    }

    /// Stops the server as `pg_ctl stop -m immediate` does (SIGQUIT to the
    /// postmaster: backends end at once, no checkpoint, so the next start
    /// replays the WAL as after a crash), waits `down` with the port
    /// closed, and starts it again on the same port and data, ready within
    /// `deadline`: what a server failover or a crash costs its clients.
    pub async fn restart_immediate(&mut self, down: Duration, deadline: Duration) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                let _ = children::signal(pid, libc::SIGQUIT);
            }
            if tokio::time::timeout(STOP_GRACE, child.wait())
                .await
                .is_err()
            {
                let _ = child.start_kill();
                let _ = tokio::time::timeout(STOP_GRACE, child.wait()).await;
            }
        }
        tokio::time::sleep(down).await;
        self.spawn_server(server_owner()?)?;
        self.wait_ready(deadline).await
    }

    /// `bin_dir/tool` with output appended to the log, run as `owner`.
    fn command(&self, tool: &str, owner: Option<(u32, u32)>) -> Result<Command> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| LadderError::io(format!("opening {}", self.log.display()), e))?;
        let err = file
            .try_clone()
            .map_err(|e| LadderError::io(format!("cloning {}", self.log.display()), e))?;
        let mut cmd = Command::new(self.bin_dir.join(tool));
        cmd.current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err));
        if let Some((uid, gid)) = owner {
            cmd.uid(uid).gid(gid);
        }
        Ok(cmd)
    }

    /// Polls `pg_isready` until the server accepts connections, it exits,
    /// or `deadline` passes.
    async fn wait_ready(&mut self, deadline: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(LadderError::Process(format!(
                    "postgres exited ({status}) before it was ready; last lines of {}:\n{}",
                    self.log.display(),
                    children::tail(&self.log)
                )));
            }
            let mut probe = self.command("pg_isready", None)?;
            probe
                .args(["-q", "-h", "127.0.0.1", "-t", "2", "-p"])
                .arg(self.port.to_string());
            if run(&mut probe, "pg_isready", TOOL_TIMEOUT, &self.log)
                .await
                .is_ok()
            {
                return Ok(());
            }
            if start.elapsed() >= deadline {
                return Err(LadderError::Process(format!(
                    "postgres on 127.0.0.1:{} not ready within {deadline:?}; last lines of {}:\n{}",
                    self.port,
                    self.log.display(),
                    children::tail(&self.log)
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The control plane's `--db` URL (the password goes in [`Postgres::env`]).
    pub fn url(&self) -> String {
        format!(
            "postgres://{SERVER_USER}@127.0.0.1:{}/{DATABASE}",
            self.port
        )
    }

    /// Environment for the control plane: the role's password.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![("PGPASSWORD".into(), self.password.clone())]
    }

    /// The postmaster's pid (its backends are its children).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// What the report says about this server.
    pub fn record(&self) -> StoreRecord {
        StoreRecord {
            backend: "postgres".into(),
            version: Some(self.version.clone()),
            started_by_ladder: true,
            bin_dir: Some(self.bin_dir.display().to_string()),
            cluster_dir: Some(self.dir.display().to_string()),
        }
    }

    /// Fast shutdown within [`STOP_GRACE`] (then immediate, then SIGKILL),
    /// and the cluster dir removed.
    pub async fn stop(mut self) {
        if let Some(mut child) = self.child.take() {
            for sig in [libc::SIGINT, libc::SIGQUIT] {
                if let Some(pid) = child.id() {
                    let _ = children::signal(pid, sig);
                }
                if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_ok() {
                    break;
                }
            }
            let _ = child.start_kill();
            let _ = tokio::time::timeout(STOP_GRACE, child.wait()).await;
        }
        remove_dir(&self.dir);
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Immediate shutdown: the postmaster stops its backends and exits.
            if let Some(pid) = child.id() {
                let _ = children::signal(pid, libc::SIGQUIT);
            }
            let until = std::time::Instant::now() + EXIT_WAIT;
            while !matches!(child.try_wait(), Ok(Some(_))) && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.start_kill();
        }
        remove_dir(&self.dir);
    }
}

/// Runs `cmd` (named `what`) within `deadline`; an error quotes the log.
async fn run(cmd: &mut Command, what: &str, deadline: Duration, log: &Path) -> Result<()> {
    cmd.kill_on_drop(true);
    let status = tokio::time::timeout(deadline, cmd.status())
        .await
        .map_err(|_| LadderError::Process(format!("{what} did not finish within {deadline:?}")))?
        .map_err(|e| LadderError::io(format!("running {what}"), e))?;
    if status.success() {
        Ok(())
    } else {
        Err(LadderError::Process(format!(
            "{what} failed ({status}); last lines of {}:\n{}",
            log.display(),
            children::tail(log)
        )))
    }
}

fn chown(path: &Path, uid: u32, gid: u32) -> Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
        .map_err(|e| LadderError::io(format!("chown {}", path.display()), e))
}

/// Writes a 0600 file owned by `owner` (the server's user).
fn write_owned(path: &Path, contents: &str, owner: Option<(u32, u32)>) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| LadderError::io(format!("creating {}", path.display()), e))?;
    f.write_all(contents.as_bytes())
        .map_err(|e| LadderError::io(format!("writing {}", path.display()), e))?;
    if let Some((uid, gid)) = owner {
        chown(path, uid, gid)?;
    }
    Ok(())
}

fn remove_dir(dir: &Path) {
    // A backend may still be writing for a moment after the postmaster went.
    for _ in 0..20 {
        match std::fs::remove_dir_all(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    eprintln!(
        "ladder: warning: could not remove PostgreSQL cluster {}; the next PostgreSQL run removes it",
        dir.display()
    );
}

/// The postmaster of the cluster in `dir`, if one runs (the first line of
/// `data/postmaster.pid`, a live process whose command line names the
/// data dir, so a reused pid is never signalled).
fn postmaster_of(dir: &Path) -> Option<u32> {
    let data = dir.join("data");
    let pid: u32 = std::fs::read_to_string(data.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let data = data.display().to_string();
    String::from_utf8_lossy(&cmdline)
        .split('\0')
        .any(|a| a == data)
        .then_some(pid)
}

/// Stops the servers and removes the cluster dirs under `parent` of runs
/// that are gone (their pid not `alive`); returns the names removed.
pub fn remove_leftovers(parent: &Path, alive: impl Fn(u32) -> bool) -> Vec<String> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(parent) else {
        return removed;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(DIR_PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if alive(pid) {
            continue;
        }
        let dir = e.path();
        if let Some(server) = postmaster_of(&dir) {
            for sig in [libc::SIGQUIT, libc::SIGKILL] {
                let _ = children::signal(server, sig);
                let until = std::time::Instant::now() + EXIT_WAIT;
                while postmaster_of(&dir).is_some() && std::time::Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(100));
                }
                if postmaster_of(&dir).is_none() {
                    break;
                }
            }
        }
        remove_dir(&dir);
        if !dir.exists() {
            removed.push(name);
        }
    }
    removed
}

#[cfg(test)]
mod tests;
