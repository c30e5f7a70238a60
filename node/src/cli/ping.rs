//! `agentmesh-node ping SERVICE`: asks the running node (Unix socket,
//! `PING <name>`) to set up a call to SERVICE and close it, `--count`
//! times, `--interval-ms` apart, each within `--timeout-ms`, and prints
//! one line per attempt: the verdict, the route, the round trip; or with
//! `--json` the node's answer as one JSON line per attempt. Exits non-zero
//! when any attempt was not granted, with one line saying why.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::time::Instant;

use super::PingArgs;
use crate::ping::{PingReply, Verdict};
use crate::status::cmd::StatusCmdError;

/// Longest answer read.
const MAX_ANSWER_BYTES: u64 = 64 * 1024;

/// Why `ping` exits non-zero.
#[derive(Debug, thiserror::Error)]
pub enum PingError {
    /// No node to ask, or the exchange with it failed.
    #[error(transparent)]
    Node(#[from] StatusCmdError),
    /// Some attempts were not granted; carries the last such answer.
    #[error("ping {service}: {failed} of {count} not granted; last: {} ({}): {}",
        verdict_word(.last.verdict),
        .last.reason.as_deref().unwrap_or("unknown"),
        .last.detail.as_deref().unwrap_or("no detail"))]
    NotGranted {
        /// The service.
        service: String,
        /// Attempts not granted.
        failed: usize,
        /// Attempts made.
        count: usize,
        /// The last attempt not granted.
        last: Box<PingReply>,
    },
}

fn verdict_word(v: Verdict) -> &'static str {
    match v {
        Verdict::Granted => "granted",
        Verdict::Refused => "refused",
        Verdict::Failed => "failed",
    }
}

/// Runs the pings, printing each attempt with `print` (a line, newline
/// included) as it ends.
pub async fn ping(args: PingArgs, mut print: impl FnMut(&str)) -> Result<(), PingError> {
    let socket = args.socket_path();
    let count = args.count.max(1) as usize;
    let timeout = Duration::from_millis(args.timeout_ms.max(1));
    let mut not_granted = Vec::new();
    for n in 0..count {
        if n > 0 {
            tokio::time::sleep(Duration::from_millis(args.interval_ms)).await;
        }
        let started = Instant::now();
        let reply = match tokio::time::timeout(timeout, ask(&socket, &args.data_dir, &args.service))
            .await
        {
            Ok(Ok(r)) => r,
            // No node: nothing more to try.
            Ok(Err(e @ StatusCmdError::NoNode { .. })) => return Err(e.into()),
            Ok(Err(e)) => PingReply::failed(
                &args.service,
                "node_error",
                e.to_string(),
                started.elapsed(),
            ),
            Err(_) => PingReply::failed(
                &args.service,
                "timeout",
                format!(
                    "no answer from the node within {} ms (--timeout-ms)",
                    timeout.as_millis()
                ),
                started.elapsed(),
            ),
        };
        let line = if args.json {
            let mut j = serde_json::to_string(&reply).unwrap_or_default();
            j.push('\n');
            j
        } else {
            render(&reply)
        };
        print(&line);
        if reply.verdict != Verdict::Granted {
            not_granted.push(reply);
        }
    }
    match not_granted.pop() {
        None => Ok(()),
        Some(last) => Err(PingError::NotGranted {
            service: args.service,
            failed: not_granted.len() + 1,
            count,
            last: Box::new(last),
        }),
    }
}

/// One attempt as a line of text.
pub(super) fn render(r: &PingReply) -> String {
    let mut o = format!("{} {}", r.service, verdict_word(r.verdict));
    match (&r.route, r.verdict) {
        (Some(route), Verdict::Granted) => {
            let _ = write!(o, " by {}", route.provider);
            match &route.router {
                Some(router) => {
                    let _ = write!(
                        o,
                        " via router {router} ({}{})",
                        route.path,
                        if route.transit { ", transit" } else { "" }
                    );
                }
                None => {
                    let _ = write!(o, " ({})", route.path);
                }
            }
            if let Some(rtt) = r.rtt_ms {
                let _ = write!(o, " in {rtt:.1} ms");
            }
            let _ = write!(o, " (set-up {:.1} ms)", r.setup_ms);
        }
        _ => {
            let _ = write!(
                o,
                " ({}): {}",
                r.reason.as_deref().unwrap_or("unknown"),
                r.detail.as_deref().unwrap_or("no detail")
            );
        }
    }
    o.push('\n');
    o
}

/// One `PING` exchange with the node.
async fn ask(socket: &Path, data_dir: &Path, service: &str) -> Result<PingReply, StatusCmdError> {
    let io = |e: std::io::Error| StatusCmdError::Io {
        socket: socket.to_path_buf(),
        detail: e.to_string(),
    };
    let mut conn = crate::status::cmd::connect(socket, data_dir).await?;
    conn.write_all(format!("PING {service}\n").as_bytes())
        .await
        .map_err(io)?;
    let mut line = String::new();
    BufReader::new(conn)
        .take(MAX_ANSWER_BYTES)
        .read_line(&mut line)
        .await
        .map_err(io)?;
    let line = line.trim_end();
    if line.is_empty() {
        return Err(StatusCmdError::Io {
            socket: socket.to_path_buf(),
            detail: "the node closed the connection without an answer".into(),
        });
    }
    if let Some(e) = line.strip_prefix("ERR ") {
        return Err(StatusCmdError::Node {
            socket: socket.to_path_buf(),
            detail: e.to_string(),
        });
    }
    serde_json::from_str(line).map_err(|e| StatusCmdError::Parse {
        socket: socket.to_path_buf(),
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ping::PingRoute;

    fn granted(transit: bool) -> PingReply {
        PingReply {
            service: "upper".into(),
            verdict: Verdict::Granted,
            reason: None,
            detail: None,
            route: Some(PingRoute {
                path: "relayed".into(),
                router: Some("12D3R".into()),
                transit,
                provider: "12D3P".into(),
            }),
            rtt_ms: Some(1.234),
            setup_ms: 9.87,
        }
    }

    #[test]
    fn an_attempt_reads_as_one_line_naming_route_and_round_trip() {
        assert_eq!(
            render(&granted(false)),
            "upper granted by 12D3P via router 12D3R (relayed) in 1.2 ms (set-up 9.9 ms)\n"
        );
        assert!(render(&granted(true)).contains("(relayed, transit)"));
        let mut direct = granted(false);
        if let Some(route) = direct.route.as_mut() {
            route.path = "direct".into();
            route.router = None;
        }
        assert_eq!(
            render(&direct),
            "upper granted by 12D3P (direct) in 1.2 ms (set-up 9.9 ms)\n"
        );
        let refused = PingReply {
            verdict: Verdict::Refused,
            reason: Some("not_granted".into()),
            detail: Some(
                "call to \"upper\" failed after 1 provider(s): provider 12D3P refused".into(),
            ),
            route: None,
            rtt_ms: None,
            ..granted(false)
        };
        assert_eq!(
            render(&refused),
            "upper refused (not_granted): call to \"upper\" failed after 1 provider(s): provider 12D3P refused\n"
        );
        let e = PingError::NotGranted {
            service: "upper".into(),
            failed: 1,
            count: 3,
            last: Box::new(refused),
        };
        let text = e.to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(
            text.starts_with(
                "ping upper: 1 of 3 not granted; last: refused (not_granted): call to"
            ),
            "{text}"
        );
    }

    #[tokio::test]
    async fn no_node_is_one_clear_error_and_no_attempt_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let args = PingArgs {
            service: "upper".into(),
            count: 3,
            interval_ms: 10,
            timeout_ms: 1000,
            json: false,
            socket_path: None,
            data_dir: dir.path().to_path_buf(),
        };
        let mut lines = Vec::new();
        let e = ping(args, |l| lines.push(l.to_string()))
            .await
            .expect_err("no node");
        assert!(lines.is_empty(), "{lines:?}");
        assert!(e.to_string().starts_with("no node is running at "), "{e}");
    }
}
