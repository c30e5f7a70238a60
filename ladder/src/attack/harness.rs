//! `agentmesh-hostile` child processes: each one attack from one source
//! address for a bounded time, its JSON summary read from its stdout when
//! it ends (stderr goes to a log in the run's directory).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt as _;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::error::{LadderError, Result};

/// Time a child gets after its own duration to print its summary and exit
/// (the flood waits up to one request deadline for its last answers).
pub const EXIT_GRACE: Duration = Duration::from_secs(30);
/// Most bytes of a child's stdout kept (its summary is one short line).
const MAX_STDOUT_BYTES: u64 = 64 * 1024;

/// What one harness process is asked to do.
#[derive(Debug, Clone)]
pub struct Part {
    /// A name for the report and the log (`router-auth 127.0.0.200`).
    pub name: String,
    /// The subcommand and its arguments (`router-auth --router …`).
    pub args: Vec<String>,
    /// How long it runs, as passed in its arguments.
    pub duration: Duration,
}

/// The JSON line `agentmesh-hostile --json` prints.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// The subcommand that ran.
    pub attack: String,
    /// What it did, by name.
    pub counts: BTreeMap<String, u64>,
}

/// A running harness process.
pub struct Running {
    /// What it was asked to do.
    pub part: Part,
    child: Child,
    log: PathBuf,
    /// When it should have printed its summary.
    ends: Instant,
}

impl Running {
    /// Starts `bin --json <part.args>` with stderr to `dir/<log_name>.log`.
    pub fn start(bin: &Path, part: Part, dir: &Path, log_name: &str) -> Result<Self> {
        let log = dir.join(format!("{log_name}.log"));
        let err = std::fs::File::create(&log)
            .map_err(|e| LadderError::io(format!("creating {}", log.display()), e))?;
        let mut cmd = Command::new(bin);
        cmd.arg("--json")
            .args(&part.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err))
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(|e| LadderError::io(format!("starting {}", bin.display()), e))?;
        let ends = Instant::now() + part.duration;
        Ok(Self {
            part,
            child,
            log,
            ends,
        })
    }

    /// Waits (until its end plus [`EXIT_GRACE`]) for the process to exit and
    /// reads its summary; kills it when the deadline passes.
    pub async fn finish(mut self) -> std::result::Result<Summary, String> {
        let deadline = self.ends + EXIT_GRACE;
        let mut stdout = self.child.stdout.take();
        let read = async {
            let mut out = String::new();
            if let Some(s) = stdout.as_mut() {
                let _ = s.take(MAX_STDOUT_BYTES).read_to_string(&mut out).await;
            }
            let status = self.child.wait().await;
            (out, status)
        };
        let (out, status) = match tokio::time::timeout_at(deadline, read).await {
            Ok(done) => done,
            Err(_) => {
                let _ = self.child.start_kill();
                let _ = tokio::time::timeout(EXIT_GRACE, self.child.wait()).await;
                return Err(format!(
                    "{} did not end within {EXIT_GRACE:?} of its duration; killed (log {})",
                    self.part.name,
                    self.log.display()
                ));
            }
        };
        match status {
            Ok(s) if s.success() => parse(&out).ok_or_else(|| {
                format!(
                    "{}: no summary line in its output (log {})",
                    self.part.name,
                    self.log.display()
                )
            }),
            Ok(s) => Err(format!(
                "{} exited with {s}; last lines of {}:\n{}",
                self.part.name,
                self.log.display(),
                crate::children::tail(&self.log)
            )),
            Err(e) => Err(format!("{}: waiting: {e}", self.part.name)),
        }
    }
}

/// The last line of `out` that is a summary.
fn parse(out: &str) -> Option<Summary> {
    out.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Summary>(l.trim()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_is_the_last_json_line() {
        let out = "noise\n{\"attack\":\"router-auth\",\"counts\":{\"streams_opened\":7}}\n";
        let s = parse(out).expect("summary");
        assert_eq!(s.attack, "router-auth");
        assert_eq!(s.counts["streams_opened"], 7);
        assert!(parse("sent 3 ok 0\n").is_none());
    }
}
