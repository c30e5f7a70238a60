//! `agentmesh-node call NAME`: stdin and stdout piped to a service through
//! a running node's Unix socket (`CALL NAME`, then `OK` or the reason),
//! with `--wait-ready-secs` first waiting (bounded) for the node to be
//! ready, so a script can call right after starting its node.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

use super::CallArgs;

/// Once `call` has its answer, how long tokio's blocking stdin read may
/// take to end before the process exits without it: that read ends only
/// with input or EOF, so with stdin left open it never would. The binary
/// runs `call` with `agentmesh_runtime::block_on_within` this grace.
pub const CALL_EXIT_GRACE: Duration = Duration::from_millis(100);

/// Why a call through the socket failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No node answers at the socket.
    #[error("connect to the node's socket {}: {source}", path.display())]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The node refused or could not set up the call.
    #[error("call {name} failed: {reason}")]
    Refused {
        /// The service.
        name: String,
        /// The node's answer.
        reason: String,
    },
    /// `--wait-ready-secs` ran out before the node was ready.
    #[error("call {name}: {wait}")]
    NotReady {
        /// The service.
        name: String,
        /// Why (not a `source`: the message already says it, and the
        /// binary's one error line would say it twice).
        wait: super::WaitError,
    },
    /// Reading or writing the call failed.
    #[error("call {name}: {source}")]
    Io {
        /// The service.
        name: String,
        /// Why.
        source: std::io::Error,
    },
}

/// Calls `args.name` through the node's socket and copies stdin to the
/// service and its answer to stdout, until the service has answered.
pub async fn call(args: CallArgs) -> Result<(), CallError> {
    let path = args.socket_path();
    if let Some(secs) = args.wait_ready_secs {
        super::wait_ready(&path, &args.data_dir, Duration::from_secs(secs))
            .await
            .map_err(|wait| CallError::NotReady {
                name: args.name.clone(),
                wait,
            })?;
    }
    let name = args.name;
    let io = |source| CallError::Io {
        name: name.clone(),
        source,
    };
    let conn = tokio::net::UnixStream::connect(&path)
        .await
        .map_err(|source| CallError::Connect {
            path: path.clone(),
            source,
        })?;
    let (r, mut w) = conn.into_split();
    w.write_all(format!("CALL {name}\n").as_bytes())
        .await
        .map_err(io)?;
    let mut r = tokio::io::BufReader::new(r);
    let mut line = String::new();
    r.read_line(&mut line).await.map_err(io)?;
    if line.trim_end() != "OK" {
        // `ERR reason` (see the socket's protocol): the reason alone.
        let reason = line.trim_end();
        return Err(CallError::Refused {
            name,
            reason: reason.strip_prefix("ERR ").unwrap_or(reason).to_string(),
        });
    }
    let up = async {
        tokio::io::copy(&mut tokio::io::stdin(), &mut w).await?;
        w.shutdown().await
    };
    let down = async {
        let mut out = tokio::io::stdout();
        tokio::io::copy(&mut r, &mut out).await?;
        out.flush().await
    };
    // The answer ends the call: once the service has closed its side and
    // the answer is on stdout, stop, whether or not stdin is still open
    // (the binary then leaves the blocked stdin read behind). A closed
    // stdin only half-closes the call.
    tokio::pin!(up, down);
    let down = tokio::select! {
        d = &mut down => d,
        _ = &mut up => down.await,
    };
    down.map_err(io)
}
