//! The node's Unix socket (default `DATA_DIR/agentmesh.sock`, mode 0600).
//!
//! One request per connection, chosen by its first line (at most 1 KiB,
//! within the call timeout):
//! - `GET /readyz HTTP/1.1` (any HTTP/1.x GET): answered `200` when ready,
//!   `503` otherwise, with the readiness line as body, then closed.
//! - `CALL <name>\n`: the node calls service `<name>`; it answers
//!   `OK\n` and from then on the connection carries the call's raw bytes
//!   both ways (half-close is passed on), or `ERR <reason>\n` and closes.
//!   `agentmesh-node call NAME` is a client of exactly this.
//! - `STATUS\n`: one JSON line, the node's [`crate::status::report::Report`]
//!   (asked of the engine), then closed; `ERR <reason>\n` when the engine
//!   does not answer. `agentmesh-node status` is its client.
//! - `SERVICES\n`: one JSON line, [`crate::status::report::Services`], then
//!   closed. `agentmesh-node services` is its client.
//! - `PING <name>\n`: the node sets up a call to `<name>` and closes it at
//!   once; one JSON line, [`crate::ping::PingReply`] (route, round trip,
//!   verdict), then closed. `agentmesh-node ping` is its client.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::local::Limit;
use crate::node::Node;

/// Longest first line accepted.
const MAX_LINE: u64 = 1024;
/// Longest HTTP header block read before answering.
const MAX_HEADERS: usize = 16 * 1024;

/// Binds the socket at `path` (replacing a stale one), mode 0600.
pub(crate) async fn bind(path: &Path) -> std::io::Result<UnixListener> {
    match tokio::fs::remove_file(path).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    let l = UnixListener::bind(path)?;
    tokio::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).await?;
    Ok(l)
}

/// Serves the socket until the node stops, at most `limit` connections at
/// once (see [`crate::local`]).
pub(crate) async fn serve(node: Arc<Node>, listener: UnixListener, limit: Arc<Limit>) {
    let conns = node.clone();
    crate::local::serve(node, "socket", listener, limit, move |conn| {
        let node = conns.clone();
        async move {
            if let Err(e) = handle(&node, conn).await {
                tracing::debug!(error = %e, "unix socket connection failed");
            }
        }
    })
    .await;
}

async fn handle(node: &Arc<Node>, conn: UnixStream) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    let read = async { (&mut reader).take(MAX_LINE).read_line(&mut line).await };
    match tokio::time::timeout(node.config.call_timeout(), read).await {
        Ok(r) => {
            r?;
        }
        Err(_) => return Ok(()),
    }
    let line = line.trim_end();
    if let Some(rest) = line.strip_prefix("GET ") {
        // Drain the header block (bounded), then answer.
        let drain = async {
            let mut total = 0;
            loop {
                let mut h = String::new();
                let n = (&mut reader).take(MAX_LINE).read_line(&mut h).await?;
                total += n;
                if n == 0 || h.trim().is_empty() || total > MAX_HEADERS {
                    return Ok::<_, std::io::Error>(());
                }
            }
        };
        if tokio::time::timeout(node.config.call_timeout(), drain)
            .await
            .is_err()
        {
            return Ok(());
        }
        let path = rest.split_whitespace().next().unwrap_or("");
        let (code, body) = if path == "/readyz" {
            let st = node.status.borrow().clone();
            (
                if st.ready {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                },
                st.readyz_line(),
            )
        } else {
            ("404 Not Found", "only /readyz here\n".to_string())
        };
        let resp = format!(
            "HTTP/1.1 {code}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let mut conn = reader.into_inner();
        conn.write_all(resp.as_bytes()).await?;
        return conn.shutdown().await;
    }
    if line == "STATUS" || line == "SERVICES" {
        let body = if line == "STATUS" {
            let limit = node.config.call_timeout();
            match node
                .ask(limit, |reply| crate::command::Command::Report { reply })
                .await
            {
                Ok(report) => serde_json::to_string(&report).map_err(std::io::Error::other)?,
                Err(e) => {
                    let st = node.status.borrow().clone();
                    format!("ERR {e}: {}", st.readyz_line().trim_end())
                }
            }
        } else {
            serde_json::to_string(&node.services()).map_err(std::io::Error::other)?
        };
        let mut conn = reader.into_inner();
        conn.write_all(format!("{body}\n").as_bytes()).await?;
        return conn.shutdown().await;
    }
    if let Some(name) = line.strip_prefix("PING ") {
        let reply = crate::ping::ping(node, name.trim()).await;
        let body = serde_json::to_string(&reply).map_err(std::io::Error::other)?;
        let mut conn = reader.into_inner();
        conn.write_all(format!("{body}\n").as_bytes()).await?;
        return conn.shutdown().await;
    }
    if let Some(name) = line.strip_prefix("CALL ") {
        let name = name.trim();
        // Bytes the client sent after the line are kept in the reader's buffer.
        let buffered = reader.buffer().to_vec();
        let mut conn = reader.into_inner();
        match crate::call::outbound::call(node, name).await {
            Ok(mut stream) => {
                conn.write_all(b"OK\n").await?;
                if !buffered.is_empty() {
                    stream.write_all(&buffered).await?;
                }
                let out = crate::call::splice::outbound(node, &mut conn, &mut stream).await;
                if let Some(e) = out.error {
                    return Err(e);
                }
            }
            Err(e) => {
                let msg = format!("ERR {}\n", e.to_string().replace('\n', " "));
                conn.write_all(msg.as_bytes()).await?;
                conn.shutdown().await?;
            }
        }
        return Ok(());
    }
    let mut conn = reader.into_inner();
    conn.write_all(
        b"ERR expected `CALL <name>`, `PING <name>`, `STATUS`, `SERVICES` or an HTTP GET\n",
    )
    .await?;
    conn.shutdown().await
}
