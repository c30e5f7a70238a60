//! One member of the fleet: the real node (`agentmesh_node::spawn`), with its
//! own identity, swarm and credential. The only file that touches the node's API.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use rand::RngCore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{RwLock, watch};

/// Service name the providers expose.
pub const ECHO: &str = "echo";
/// Bytes sent (and expected back) per echo call.
const ECHO_PAYLOAD_BYTES: usize = 64;

/// How to start one member.
#[derive(Debug, Clone)]
pub struct MemberSpec {
    /// Control-plane gRPC URL.
    pub control_plane: String,
    /// Enrollment token.
    pub token: String,
    /// The member's own data dir.
    pub data_dir: PathBuf,
    /// Routers to hold (K).
    pub routers: usize,
    /// The echo backend to expose, for providers.
    pub expose_echo: Option<SocketAddr>,
    /// Source address for outgoing connections.
    pub dial_source_ip: Option<IpAddr>,
    /// Serve the Unix socket (only the 1% checked over it).
    pub socket: bool,
    /// Deadline for one call's set-up.
    pub call_timeout: Duration,
}

/// What the ladder reads of a member's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct View {
    /// It holds a credential.
    pub enrolled: bool,
    /// It is ready (admitted and reserved on at least one router).
    pub ready: bool,
    /// Routers it holds a reservation on.
    pub routers: usize,
    /// The node has begun stopping.
    pub stopping: bool,
}

/// A running member.
pub struct Member {
    /// `None` once shut down. Calls hold the read side; shutdown takes the handle.
    handle: RwLock<Option<agentmesh_node::NodeHandle>>,
    status: watch::Receiver<agentmesh_node::NodeStatus>,
    socket: Option<PathBuf>,
}

impl Member {
    /// Starts the node; returns once it holds a credential (the node enrolls inside `spawn`).
    pub async fn start(spec: MemberSpec) -> Result<Self, String> {
        let socket = spec.data_dir.join(agentmesh_node::config::SOCKET_FILE);
        let config = agentmesh_node::Config {
            control_plane: spec.control_plane,
            token: spec.token,
            data_dir: spec.data_dir,
            routers: spec.routers,
            expose: spec
                .expose_echo
                .map(|a| vec![(ECHO.to_string(), a)])
                .unwrap_or_default(),
            no_socket: !spec.socket,
            socket_path: None,
            dial_source_ip: spec.dial_source_ip,
            call_timeout_secs: spec.call_timeout.as_secs().max(1),
            ..agentmesh_node::Config::default()
        };
        let handle = agentmesh_node::spawn(config, None)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            status: handle.status(),
            handle: RwLock::new(Some(handle)),
            socket: spec.socket.then_some(socket),
        })
    }

    /// The member's Unix socket, when it serves one.
    pub fn socket(&self) -> Option<&PathBuf> {
        self.socket.as_ref()
    }

    /// A receiver of the member's state; `changed()` errors once the node has ended.
    pub fn watch(&self) -> Watch {
        Watch {
            status: self.status.clone(),
        }
    }

    /// One echo call through the mesh: random bytes out, the same bytes back.
    pub async fn call_echo(&self, timeout: Duration) -> Result<(), String> {
        let fut = async {
            let guard = self.handle.read().await;
            let handle = guard
                .as_ref()
                .ok_or_else(|| "member shut down".to_string())?;
            let mut stream = handle.call(ECHO).await.map_err(|e| format!("call: {e}"))?;
            let mut payload = [0u8; ECHO_PAYLOAD_BYTES];
            rand::thread_rng().fill_bytes(&mut payload);
            stream
                .write_all(&payload)
                .await
                .map_err(|e| format!("write: {e}"))?;
            stream.flush().await.map_err(|e| format!("flush: {e}"))?;
            let mut back = [0u8; ECHO_PAYLOAD_BYTES];
            stream
                .read_exact(&mut back)
                .await
                .map_err(|e| format!("read: {e}"))?;
            if back != payload {
                return Err("echo came back different".to_string());
            }
            let _ = stream.shutdown().await;
            Ok(())
        };
        match tokio::time::timeout(timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(format!("no echo within {timeout:?}")),
        }
    }

    /// Stops the node (withdraws records, closes connections).
    pub async fn shutdown(&self) {
        let handle = self.handle.write().await.take();
        if let Some(h) = handle {
            h.shutdown().await;
        }
    }
}

/// A member's state as a watch.
#[derive(Clone)]
pub struct Watch {
    status: watch::Receiver<agentmesh_node::NodeStatus>,
}

impl Watch {
    /// The current state.
    pub fn view(&self) -> View {
        let s = self.status.borrow();
        View {
            enrolled: s.enrolled,
            ready: s.ready,
            routers: s.reserved.len(),
            stopping: s.stopping,
        }
    }

    /// Waits for a change; `Err` when the node has ended.
    pub async fn changed(&mut self) -> Result<(), ()> {
        self.status.changed().await.map_err(|_| ())
    }
}
