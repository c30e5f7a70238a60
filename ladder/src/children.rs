//! Child programs: spawning with logs to a file, waiting on `/readyz`,
//! signals, and stopping with a deadline.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::error::{LadderError, Result};
use crate::http;

/// Period between `/readyz` polls.
const READY_POLL: Duration = Duration::from_millis(200);
/// Deadline of one `/readyz` read.
const READY_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Log lines quoted when a child fails.
const LOG_TAIL_LINES: usize = 20;

/// Spawns `bin args…` with stdout and stderr appended to `log`.
pub fn spawn(bin: &Path, args: &[String], log: &Path) -> Result<Child> {
    spawn_at(&[], bin, args, log)
}

/// Spawns `bin args…` behind the command prefix `at` (e.g. `ip netns exec
/// NAMESPACE`, which execs the program in place, so the child's pid is the
/// program's); an empty prefix starts it here. Logs as [`spawn`].
pub fn spawn_at(
    at: &[std::ffi::OsString],
    bin: &Path,
    args: &[String],
    log: &Path,
) -> Result<Child> {
    spawn_with_env(at, bin, args, &[], log)
}

/// [`spawn_at`] with `env` added to the child's environment (secrets such
/// as `PGPASSWORD` that must not show in its command line).
pub fn spawn_with_env(
    at: &[std::ffi::OsString],
    bin: &Path,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
) -> Result<Child> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| LadderError::io(format!("opening {}", log.display()), e))?;
    let err_file = file
        .try_clone()
        .map_err(|e| LadderError::io(format!("cloning {}", log.display()), e))?;
    let mut cmd = match at.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(err_file))
        .kill_on_drop(true);
    // No RUST_LOG of our own: each binary's default filter (info, minus the
    // kad bootstrap warning a new mesh always triggers) applies unless the
    // operator of the ladder sets one.
    tracing::debug!(bin = %bin.display(), ?args, "spawning");
    cmd.spawn()
        .map_err(|e| LadderError::io(format!("starting {}", bin.display()), e))
}

/// Waits until `GET addr/readyz` answers 200, the child exits, or the deadline passes.
pub async fn wait_ready(
    name: &str,
    child: &mut Child,
    addr: SocketAddr,
    deadline: Duration,
    log: &Path,
) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(LadderError::Process(format!(
                "{name} exited ({status}) before it was ready; last lines of {}:\n{}",
                log.display(),
                tail(log)
            )));
        }
        if let Ok(r) = http::get(addr, "/readyz", READY_READ_TIMEOUT).await
            && r.status == 200
        {
            return Ok(start.elapsed());
        }
        if start.elapsed() >= deadline {
            return Err(LadderError::Process(format!(
                "{name} not ready at http://{addr}/readyz within {deadline:?}; last lines of {}:\n{}",
                log.display(),
                tail(log)
            )));
        }
        tokio::time::sleep(READY_POLL).await;
    }
}

/// The last lines of a log file.
pub fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// Sends SIGTERM to `pid`.
pub fn sigterm(pid: u32) -> Result<()> {
    signal(pid, libc::SIGTERM)
}

/// Sends signal `sig` to `pid`.
pub fn signal(pid: u32, sig: libc::c_int) -> Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| LadderError::Process(format!("pid {pid} out of range")))?;
    // SAFETY: kill(2) with a positive pid and a valid signal number has no
    // memory-safety preconditions.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::kill(pid, sig) };
    if rc == 0 {
        Ok(())
    } else {
        Err(LadderError::io(
            format!("signal {sig} to {pid}"),
            std::io::Error::last_os_error(),
        ))
    }
}

/// SIGTERM, then SIGKILL if the child has not exited within `grace`.
pub async fn stop(child: &mut Child, grace: Duration) {
    if let Some(pid) = child.id() {
        let _ = sigterm(pid);
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return;
        }
    }
    let _ = child.start_kill();
    let _ = tokio::time::timeout(grace, child.wait()).await;
}

/// Writes `contents` to `path` with mode 0600.
pub fn write_secret(path: &Path, contents: &str) -> Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| LadderError::io(format!("creating {}", path.display()), e))?;
    f.write_all(contents.as_bytes())
        .map_err(|e| LadderError::io(format!("writing {}", path.display()), e))?;
    Ok(path.to_path_buf())
}

/// `bytes` random bytes as lowercase hex (tokens, passwords).
pub fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}
