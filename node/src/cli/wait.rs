//! Waiting for a node to be ready: `agentmesh-node wait` and
//! `agentmesh-node call --wait-ready-secs`. Polls the node's Unix socket
//! (`GET /readyz`) until it answers 200, within one deadline: a socket that
//! does not exist yet (the node is still starting, or not started) is
//! waited for like a node that is not ready. Each poll is bounded, and
//! polls are 100–200 ms apart (jittered, so many waiting scripts do not
//! poll in step).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::Rng as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

/// Shortest pause between polls (the longest is twice it).
const POLL_PAUSE: Duration = Duration::from_millis(100);
/// Longest one poll (connect, ask, read the answer) may take.
const POLL_TIMEOUT: Duration = Duration::from_secs(2);
/// Most bytes of a `/readyz` answer read.
const MAX_ANSWER_BYTES: u64 = 16 * 1024;

/// The node did not become ready in time.
#[derive(Debug, thiserror::Error)]
#[error("the node at {} was not ready within {}s: {last}", .data_dir.display(), .limit.as_secs())]
pub struct WaitError {
    /// The data dir waited on.
    pub data_dir: PathBuf,
    /// The deadline.
    pub limit: Duration,
    /// What the last poll found (no socket yet, or the node's own
    /// not-ready line).
    pub last: String,
}

/// What one poll found.
enum Poll {
    Ready,
    NotReady(String),
}

/// Waits until the node listening on `socket` (data dir `data_dir`) says
/// it is ready, at most `limit`.
pub async fn wait_ready(socket: &Path, data_dir: &Path, limit: Duration) -> Result<(), WaitError> {
    let end = Instant::now() + limit;
    let mut last = format!("no node socket at {}", socket.display());
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left.min(POLL_TIMEOUT), poll(socket)).await {
            Ok(Poll::Ready) => return Ok(()),
            Ok(Poll::NotReady(why)) => last = why,
            Err(_) => last = format!("the node on {} did not answer in time", socket.display()),
        }
        let pause = POLL_PAUSE.mul_f64(1.0 + rand::thread_rng().gen_range(0.0..1.0));
        if Instant::now() + pause >= end {
            return Err(WaitError {
                data_dir: data_dir.to_path_buf(),
                limit,
                last,
            });
        }
        tokio::time::sleep(pause).await;
    }
}

/// One `GET /readyz` over the socket.
async fn poll(socket: &Path) -> Poll {
    let mut conn = match tokio::net::UnixStream::connect(socket).await {
        Ok(c) => c,
        Err(e) => {
            return Poll::NotReady(format!("no node listens on {} ({e})", socket.display()));
        }
    };
    let asked = async {
        conn.write_all(b"GET /readyz HTTP/1.1\r\nhost: node\r\n\r\n")
            .await?;
        let mut answer = String::new();
        (&mut conn)
            .take(MAX_ANSWER_BYTES)
            .read_to_string(&mut answer)
            .await?;
        Ok::<_, std::io::Error>(answer)
    };
    match asked.await {
        Ok(a) if a.starts_with("HTTP/1.1 200") => Poll::Ready,
        Ok(a) => {
            let body = a.split("\r\n\r\n").nth(1).unwrap_or("").trim();
            Poll::NotReady(if body.is_empty() {
                "the node answered without a reason".to_string()
            } else {
                format!("the node says {body}")
            })
        }
        Err(e) => Poll::NotReady(format!("reading the node's answer: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[tokio::test]
    async fn no_node_ever_times_out_with_one_line_naming_the_data_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("agentmesh.sock");
        let started = std::time::Instant::now();
        let e = wait_ready(&socket, dir.path(), Duration::from_millis(500))
            .await
            .expect_err("no node");
        // Bounded: the deadline, plus at most one poll's pause.
        assert!(started.elapsed() < Duration::from_secs(5), "{e}");
        let text = e.to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(
            text.contains(&format!(
                "the node at {} was not ready",
                dir.path().display()
            )),
            "{text}"
        );
        assert!(text.contains("no node listens on"), "{text}");
    }

    #[tokio::test]
    async fn a_not_ready_answer_is_waited_past_and_its_reason_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("agentmesh.sock");
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind");
        // Two not-ready answers, then ready.
        let server = tokio::spawn(async move {
            for (n, code) in [
                (1, "503 Service Unavailable"),
                (2, "503 Service Unavailable"),
                (3, "200 OK"),
            ] {
                let (mut c, _) = listener.accept().await.expect("accept");
                let mut buf = [0u8; 256];
                let _ = c.read(&mut buf).await;
                let body = format!("not ready: poll {n}\n");
                let _ = c
                    .write_all(
                        format!(
                            "HTTP/1.1 {code}\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            }
            listener
        });
        wait_ready(&socket, dir.path(), Duration::from_secs(30))
            .await
            .expect("ready on the third poll");
        let listener = server.await.expect("server");
        // A node that stays not ready: the error carries its own words.
        let server = tokio::spawn(async move {
            loop {
                let (mut c, _) = listener.accept().await.expect("accept");
                let mut buf = [0u8; 256];
                let _ = c.read(&mut buf).await;
                let body = "not ready: no router reservation yet\n";
                let _ = c
                    .write_all(
                        format!(
                            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            }
        });
        let e = wait_ready(&socket, dir.path(), Duration::from_millis(400))
            .await
            .expect_err("never ready");
        assert!(
            e.to_string()
                .contains("the node says not ready: no router reservation yet"),
            "{e}"
        );
        server.abort();
    }
}
