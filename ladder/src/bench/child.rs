//! The coordinator's side of a `bench-peer` child: spawn it, read its
//! first line (`listening <addr>` or `ready`), send requests, and stop it
//! by closing its stdin (kill on drop as the backstop).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::peer::{Request, Response};

/// Deadline for a peer's first line.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// A running `bench-peer`.
pub(super) struct Peer {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Lines<BufReader<ChildStdout>>,
    log: std::path::PathBuf,
    /// What its first line said after `listening ` (empty for a client).
    pub(super) addr: String,
}

impl Peer {
    /// Starts `ladder bench-peer args…` (stderr to `dir/name.log`) and
    /// waits for its first line.
    pub(super) async fn start(
        ladder: &Path,
        dir: &Path,
        name: &str,
        args: &[String],
    ) -> anyhow::Result<Self> {
        let log = dir.join(format!("{name}.log"));
        let err =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut child = Command::new(ladder)
            .arg("bench-peer")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let stdin = child.stdin.take().context("child stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("child stdout")?).lines();
        let mut peer = Self {
            name: name.to_string(),
            child,
            stdin: Some(stdin),
            stdout,
            log,
            addr: String::new(),
        };
        let first = peer.line(START_DEADLINE).await?;
        peer.addr = match first.strip_prefix("listening ") {
            Some(a) => a.to_string(),
            None if first == "ready" => String::new(),
            None => bail!("{name}: unexpected first line {first:?}"),
        };
        Ok(peer)
    }

    /// The child's pid (for `/proc/PID/stat`).
    pub(super) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    async fn line(&mut self, deadline: Duration) -> anyhow::Result<String> {
        match tokio::time::timeout(deadline, self.stdout.next_line()).await {
            Ok(Ok(Some(l))) => Ok(l),
            Ok(Ok(None)) => bail!(
                "{} exited; last lines of {}:\n{}",
                self.name,
                self.log.display(),
                crate::children::tail(&self.log)
            ),
            Ok(Err(e)) => bail!("{}: reading its stdout: {e}", self.name),
            Err(_) => bail!("{}: no answer within {deadline:?}", self.name),
        }
    }

    /// Sends one request and waits (at most `deadline`) for its answer.
    pub(super) async fn request(
        &mut self,
        req: &Request,
        deadline: Duration,
    ) -> anyhow::Result<Response> {
        let stdin = self.stdin.as_mut().context("peer already stopped")?;
        stdin
            .write_all(format!("{}\n", serde_json::to_string(req)?).as_bytes())
            .await?;
        stdin.flush().await?;
        let line = self.line(deadline).await?;
        let resp: Response = serde_json::from_str(&line)
            .with_context(|| format!("{}: bad answer {line:?}", self.name))?;
        if let Response::Error(e) = &resp {
            bail!("{}: {req:?} failed: {e}", self.name);
        }
        Ok(resp)
    }

    /// Closes stdin and waits for the exit (kills after a short grace).
    pub(super) async fn stop(mut self) {
        self.stdin.take();
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
    }
}
