//! `agentmesh-node status` and `agentmesh-node services`: clients of a
//! running node's Unix socket (`STATUS`, `SERVICES`; see the socket's
//! protocol in the node's `socket` module). Each asks once, within a
//! deadline, and gives the text to print: human-readable, or the node's
//! JSON as it came with `json`. When nothing listens at the socket, the
//! error says that no node runs at that data dir.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};

use crate::status::report::{Report, Services};

/// Longest answer read (a report with many routers and services stays far below).
const MAX_ANSWER_BYTES: u64 = 1 << 20;

/// Why a status request gave nothing to print.
#[derive(Debug, thiserror::Error)]
pub enum StatusCmdError {
    /// Nothing listens at the socket: no node runs with that data dir.
    #[error("no node is running at {}: nothing listens on {} ({reason})", .data_dir.display(), .socket.display())]
    NoNode {
        /// The data dir asked about (the socket's folder).
        data_dir: PathBuf,
        /// The socket tried.
        socket: PathBuf,
        /// What connecting said.
        reason: String,
    },
    /// The node answered with an error.
    #[error("the node on {} answered: {detail}", .socket.display())]
    Node {
        /// The socket.
        socket: PathBuf,
        /// Its answer.
        detail: String,
    },
    /// The exchange failed or took longer than the deadline.
    #[error("talking to the node on {}: {detail}", .socket.display())]
    Io {
        /// The socket.
        socket: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// The answer was not what this version understands.
    #[error("the node on {} sent an answer this version cannot read: {detail}", .socket.display())]
    Parse {
        /// The socket.
        socket: PathBuf,
        /// What could not be read.
        detail: String,
    },
}

/// What to ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// `agentmesh-node status`.
    Status,
    /// `agentmesh-node services`.
    Services,
}

/// Asks the node listening on `socket` (in data dir `data_dir`) and
/// returns the text to print (ending in a newline), all within `limit`.
pub async fn ask(
    socket: &Path,
    data_dir: &Path,
    what: Ask,
    json: bool,
    limit: Duration,
) -> Result<String, StatusCmdError> {
    let io = |detail: String| StatusCmdError::Io {
        socket: socket.to_path_buf(),
        detail,
    };
    let line = tokio::time::timeout(limit, exchange(socket, data_dir, what))
        .await
        .map_err(|_| io(format!("no answer within {limit:?}")))??;
    let line = line.trim_end();
    if let Some(e) = line.strip_prefix("ERR ") {
        return Err(StatusCmdError::Node {
            socket: socket.to_path_buf(),
            detail: e.to_string(),
        });
    }
    let parse = |e: serde_json::Error| StatusCmdError::Parse {
        socket: socket.to_path_buf(),
        detail: e.to_string(),
    };
    let text = match (what, json) {
        (Ask::Status, false) => serde_json::from_str::<Report>(line)
            .map_err(parse)?
            .render(),
        (Ask::Services, false) => serde_json::from_str::<Services>(line)
            .map_err(parse)?
            .render(),
        (_, true) => {
            // Checked, then printed as the node sent it.
            let _: serde_json::Value = serde_json::from_str(line).map_err(parse)?;
            format!("{line}\n")
        }
    };
    Ok(text)
}

/// Connects to the node's socket; nothing listening there (no socket, or
/// a stale one) is [`StatusCmdError::NoNode`].
pub(crate) async fn connect(
    socket: &Path,
    data_dir: &Path,
) -> Result<tokio::net::UnixStream, StatusCmdError> {
    match tokio::net::UnixStream::connect(socket).await {
        Ok(c) => Ok(c),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            Err(StatusCmdError::NoNode {
                data_dir: data_dir.to_path_buf(),
                socket: socket.to_path_buf(),
                reason: e.to_string(),
            })
        }
        Err(e) => Err(StatusCmdError::Io {
            socket: socket.to_path_buf(),
            detail: e.to_string(),
        }),
    }
}

async fn exchange(socket: &Path, data_dir: &Path, what: Ask) -> Result<String, StatusCmdError> {
    let io = |e: std::io::Error| StatusCmdError::Io {
        socket: socket.to_path_buf(),
        detail: e.to_string(),
    };
    let mut conn = connect(socket, data_dir).await?;
    let request: &[u8] = match what {
        Ask::Status => b"STATUS\n",
        Ask::Services => b"SERVICES\n",
    };
    conn.write_all(request).await.map_err(io)?;
    let mut line = String::new();
    BufReader::new(conn)
        .take(MAX_ANSWER_BYTES)
        .read_line(&mut line)
        .await
        .map_err(io)?;
    if line.is_empty() {
        return Err(StatusCmdError::Io {
            socket: socket.to_path_buf(),
            detail: "the node closed the connection without an answer".into(),
        });
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_socket_means_no_node_at_that_data_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("agentmesh.sock");
        let e = ask(
            &socket,
            dir.path(),
            Ask::Status,
            false,
            Duration::from_secs(5),
        )
        .await
        .expect_err("no node");
        assert!(matches!(e, StatusCmdError::NoNode { .. }), "{e:?}");
        let text = e.to_string();
        assert!(text.starts_with("no node is running at "), "{text}");
        assert!(!text.contains('\n'), "one line: {text}");
        // A stale socket file (the node died) says the same.
        let l = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        drop(l);
        let e = ask(
            &socket,
            dir.path(),
            Ask::Services,
            true,
            Duration::from_secs(5),
        )
        .await
        .expect_err("stale");
        assert!(matches!(e, StatusCmdError::NoNode { .. }), "{e:?}");
    }
}
