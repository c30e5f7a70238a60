//! Running `ip`, `nft` and `sysctl`: each with a deadline, its stderr in the
//! error. The async form is for building a testbed; the blocking form for
//! `Drop` and the sweep of leftovers, where no runtime may be at hand.

use std::io::Write as _;
use std::process::{Command as StdCommand, Output, Stdio};
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;

use crate::error::Error;

/// Deadline of one command: they are netlink calls that take milliseconds.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);
/// How often the blocking form checks whether its command has exited.
const POLL: Duration = Duration::from_millis(5);

fn line(program: &str, args: &[&str]) -> String {
    let mut s = program.to_string();
    for a in args {
        s.push(' ');
        s.push_str(a);
    }
    s
}

fn check(command: String, out: Output) -> Result<String, Error> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Runs `program args…` with `stdin` written to it, and returns its stdout.
pub(crate) async fn run(
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, Error> {
    let command = line(program, args);
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::io(format!("starting `{command}`"), e))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .await
            .map_err(|e| Error::io(format!("writing to `{command}`"), e))?;
    }
    match tokio::time::timeout(COMMAND_TIMEOUT, child.wait_with_output()).await {
        Ok(out) => check(
            command.clone(),
            out.map_err(|e| Error::io(format!("waiting for `{command}`"), e))?,
        ),
        // Dropping the future dropped the child: kill_on_drop killed it.
        Err(_) => Err(Error::CommandTimeout {
            command,
            timeout: COMMAND_TIMEOUT,
        }),
    }
}

/// As [`run`], blocking the calling thread (for `Drop` and the sweep).
pub(crate) fn run_blocking(
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, Error> {
    let command = line(program, args);
    let mut child = StdCommand::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io(format!("starting `{command}`"), e))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|e| Error::io(format!("writing to `{command}`"), e))?;
    }
    // Our commands print little: their pipes never fill before they exit.
    let end = std::time::Instant::now() + COMMAND_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < end => std::thread::sleep(POLL),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::CommandTimeout {
                    command,
                    timeout: COMMAND_TIMEOUT,
                });
            }
            Err(e) => return Err(Error::io(format!("waiting for `{command}`"), e)),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io(format!("waiting for `{command}`"), e))?;
    check(command, out)
}

/// Whether `program` can be started (`program arg` exits, whatever its status).
pub(crate) fn exists(program: &str, arg: &str) -> bool {
    StdCommand::new(program)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}
