//! Programs started inside a host: our real binaries, each with the host's
//! address, stdout and stderr appended to one log file per program.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::time::Instant;

use super::Host;
use crate::error::Error;
use crate::sweep::NETNS_DIR;

/// Lines of a log quoted in errors.
pub const LOG_TAIL_LINES: usize = 30;
/// How often [`Proc::wait_for_log`] rereads the log.
const LOG_POLL: Duration = Duration::from_millis(100);
/// How long a started program may take to join its namespace.
const ENTER_DEADLINE: Duration = Duration::from_secs(10);
/// How often that is checked.
const ENTER_POLL: Duration = Duration::from_millis(2);

/// A program about to start on a host (a builder).
#[derive(Debug)]
pub struct Program {
    host: Host,
    name: String,
    exe: PathBuf,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
}

impl Program {
    pub(crate) fn new(host: Host, name: &str, exe: &Path) -> Self {
        Self {
            host,
            name: name.to_string(),
            exe: exe.to_path_buf(),
            args: Vec::new(),
            envs: Vec::new(),
        }
    }

    /// Appends one argument.
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable of the program.
    pub fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Self {
        self.envs.push((k.into(), v.into()));
        self
    }

    /// Starts it and returns once it runs inside its host's namespace (so
    /// the testbed's cleanup, which kills what is inside its namespaces,
    /// finds it); it is killed when the returned [`Proc`] is dropped, and
    /// with its namespace when the testbed ends.
    pub async fn spawn(self) -> Result<Proc, Error> {
        let log = self.host.logs_dir().join(format!("{}.log", self.name));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
        let err = file
            .try_clone()
            .map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
        let mut cmd = self.host.command(&self.exe);
        cmd.args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err));
        let child = cmd.spawn().map_err(|e| {
            Error::io(
                format!(
                    "starting {} on host {}",
                    self.exe.display(),
                    self.host.name()
                ),
                e,
            )
        })?;
        tracing::debug!(program = %self.name, host = %self.host.name(), pid = ?child.id(), "started");
        let mut proc = Proc {
            name: self.name,
            host: self.host,
            child,
            log,
        };
        proc.wait_inside().await?;
        Ok(proc)
    }
}

/// A running program on a host.
#[derive(Debug)]
pub struct Proc {
    name: String,
    host: Host,
    child: tokio::process::Child,
    log: PathBuf,
}

impl Proc {
    /// Its name (the log is `NAME.log`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host it runs on.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Its log so far (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last [`LOG_TAIL_LINES`] lines of its log.
    pub fn log_tail(&self) -> String {
        tail(&self.log(), LOG_TAIL_LINES)
    }

    /// Its process id, until it has been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Its exit status if it has exited.
    pub fn try_exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends `signal` (e.g. `SIGTERM` for a graceful stop or a drain).
    pub fn signal(&self, signal: Signal) -> Result<(), Error> {
        let pid = self.pid().ok_or_else(|| Error::Exited {
            what: format!("signalling {}", self.name),
            status: "reaped".into(),
            detail: String::new(),
        })?;
        let pid = i32::try_from(pid).map_err(|_| Error::Name {
            name: pid.to_string(),
            why: "not a pid".into(),
        })?;
        kill(Pid::from_raw(pid), signal)
            .map_err(|e| Error::io(format!("signalling {}", self.name), e.into()))
    }

    /// Waits until it exits, up to `deadline`.
    pub async fn wait(&mut self, deadline: Duration) -> Result<ExitStatus, Error> {
        match tokio::time::timeout(deadline, self.child.wait()).await {
            Ok(r) => r.map_err(|e| Error::io(format!("waiting for {}", self.name), e)),
            Err(_) => Err(Error::Deadline {
                what: format!("{} exiting", self.name),
                deadline,
                detail: format!("; last lines of its log:\n{}", self.log_tail()),
            }),
        }
    }

    /// Kills it (SIGKILL) and reaps it.
    pub async fn kill(&mut self) -> Result<ExitStatus, Error> {
        self.child
            .kill()
            .await
            .map_err(|e| Error::io(format!("killing {}", self.name), e))?;
        self.child
            .wait()
            .await
            .map_err(|e| Error::io(format!("reaping {}", self.name), e))
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub async fn stop(&mut self, grace: Duration) -> Result<ExitStatus, Error> {
        if let Some(s) = self.try_exited() {
            return Ok(s);
        }
        let _ = self.signal(Signal::SIGTERM);
        match self.wait(grace).await {
            Ok(s) => Ok(s),
            Err(_) => self.kill().await,
        }
    }

    /// Waits until the process has joined its host's namespace (`ip netns
    /// exec` joins it before it runs the program), or has exited.
    async fn wait_inside(&mut self) -> Result<(), Error> {
        let ns = Path::new(NETNS_DIR).join(self.host.namespace());
        let want = std::fs::metadata(&ns)
            .map_err(|e| Error::io(format!("reading {}", ns.display()), e))?
            .ino();
        let end = Instant::now() + ENTER_DEADLINE;
        loop {
            let Some(pid) = self.pid() else {
                return Ok(());
            };
            let link = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap_or_default();
            if link.to_string_lossy() == format!("net:[{want}]") || self.try_exited().is_some() {
                return Ok(());
            }
            if Instant::now() >= end {
                return Err(Error::Deadline {
                    what: format!("{} entering namespace {}", self.name, self.host.namespace()),
                    deadline: ENTER_DEADLINE,
                    detail: String::new(),
                });
            }
            tokio::time::sleep(ENTER_POLL).await;
        }
    }

    /// Rereads its log until `find` returns `Some` for a line, up to
    /// `deadline`; fails early, quoting the log, if the program exits.
    pub async fn wait_for_log<T>(
        &mut self,
        what: &str,
        deadline: Duration,
        mut find: impl FnMut(&str) -> Option<T>,
    ) -> Result<T, Error> {
        let end = Instant::now() + deadline;
        loop {
            if let Some(v) = self.log().lines().find_map(&mut find) {
                return Ok(v);
            }
            if let Some(status) = self.try_exited() {
                return Err(Error::Exited {
                    what: format!("{what} in the log of {}", self.name),
                    status: status.to_string(),
                    detail: format!("; last lines of its log:\n{}", self.log_tail()),
                });
            }
            if Instant::now() >= end {
                return Err(Error::Deadline {
                    what: format!("{what} in the log of {}", self.name),
                    deadline,
                    detail: format!("; last lines of its log:\n{}", self.log_tail()),
                });
            }
            tokio::time::sleep(LOG_POLL).await;
        }
    }
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
