//! One member of the fleet: the real node (`agentmesh_node::spawn`), with its
//! own identity, swarm and credential. The only file that touches the node's API.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use agentmesh_node::config as node_config;
use rand::RngCore;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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
    /// The control plane's replicas to dial (empty: the URL alone).
    pub control_plane_endpoints: Vec<String>,
    /// PEM CA of an `https://` control plane.
    pub control_plane_ca: Option<PathBuf>,
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
    /// Ping interval on each connection (node `--ping-interval-secs`).
    pub ping_interval: Duration,
    /// Wait before the other K - 1 routers after a rejoin (node
    /// `--router-rejoin-spread-ms`).
    pub rejoin_spread: Duration,
    /// A second service name exposed on the echo backend, for providers.
    pub expose_also: Option<String>,
    /// Direct connections on (node `--direct`).
    pub direct: bool,
    /// Their transport (node `--direct-transport`).
    pub direct_transport: node_config::DirectTransport,
    /// QUIC's idle timeout (node `--direct-quic-idle-timeout-secs`).
    pub quic_idle_timeout: Duration,
}

/// How an echo call reached its provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EchoRoute {
    /// The provider's PeerId.
    pub provider: String,
    /// The stream went on a direct connection.
    pub direct: bool,
}

/// Time the node's own `call()` may take past its budget before the ladder
/// calls it stuck: the node ends its attempts by its deadline, then returns.
const CALL_RETURN_GRACE: Duration = Duration::from_secs(2);

/// How long the ladder waits for each phase of one echo call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallDeadlines {
    /// For `call()` to return: the node's budget (connect + call timeout,
    /// its route and lookup retries included) plus [`CALL_RETURN_GRACE`], so a
    /// node that gives up in time reports its own error, not ours.
    pub call: Duration,
    /// For the echo once the call was accepted (the node's call timeout).
    pub echo: Duration,
}

impl CallDeadlines {
    /// The deadlines that match a node started with `config`.
    pub fn of(config: &agentmesh_node::Config) -> Self {
        Self {
            call: config.call_budget() + CALL_RETURN_GRACE,
            echo: config.call_timeout(),
        }
    }
}

/// Why one echo call failed, by phase: the reasons the report counts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallFailure {
    /// The member was already shut down.
    #[error("member shut down")]
    ShutDown,
    /// `call()` returned an error; carries the node's kind of error
    /// (`CallError::result_label`: not_ready, lookup_failed, no_providers,
    /// refused, timeout, connect_failed, shutting_down).
    #[error("call: {0}")]
    Call(&'static str),
    /// `call()` had not returned by the deadline (still looking up,
    /// connecting or retrying).
    #[error("call did not return within {0:?}")]
    CallNotReturned(Duration),
    /// The call was accepted (stream open) but the echo did not come back in time.
    #[error("echo not returned within {0:?}")]
    EchoNotReturned(Duration),
    /// An I/O error on the open stream (`op` is write, flush or read).
    #[error("stream {op}: {kind}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The error's kind (kept coarse so reasons group).
        kind: io::ErrorKind,
    },
    /// The echo came back with different bytes.
    #[error("echo came back different")]
    Mismatch,
}

/// One echo over the stream `call` yields, each phase under its deadline.
/// Generic over the stream so the classification is tested on real streams.
pub async fn echo_over<S>(
    call: impl Future<Output = Result<S, agentmesh_node::CallError>>,
    deadlines: CallDeadlines,
) -> Result<(), CallFailure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    echo_noting(call, deadlines, |_| ()).await
}

/// [`echo_over`], returning what `note` read off the stream once the call
/// returned it (how it was routed).
async fn echo_noting<S, R>(
    call: impl Future<Output = Result<S, agentmesh_node::CallError>>,
    deadlines: CallDeadlines,
    note: impl FnOnce(&S) -> R,
) -> Result<R, CallFailure>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut stream = match tokio::time::timeout(deadlines.call, call).await {
        Err(_) => return Err(CallFailure::CallNotReturned(deadlines.call)),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "echo call failed");
            return Err(CallFailure::Call(e.result_label()));
        }
        Ok(Ok(s)) => s,
    };
    let noted = note(&stream);
    let io = |op| move |e: io::Error| CallFailure::Io { op, kind: e.kind() };
    let echo = async {
        let mut payload = [0u8; ECHO_PAYLOAD_BYTES];
        rand::thread_rng().fill_bytes(&mut payload);
        stream.write_all(&payload).await.map_err(io("write"))?;
        stream.flush().await.map_err(io("flush"))?;
        let mut back = [0u8; ECHO_PAYLOAD_BYTES];
        stream.read_exact(&mut back).await.map_err(io("read"))?;
        if back != payload {
            return Err(CallFailure::Mismatch);
        }
        let _ = stream.shutdown().await;
        Ok(())
    };
    match tokio::time::timeout(deadlines.echo, echo).await {
        Ok(r) => r.map(|()| noted),
        Err(_) => Err(CallFailure::EchoNotReturned(deadlines.echo)),
    }
}

/// Pause between two pings of a held call: its stream is read all the
/// while, so an end is seen at once; the ping shows it still carries bytes.
pub const HOLD_PING_EVERY: Duration = Duration::from_secs(1);

/// Holds an open call: an echo ping every [`HOLD_PING_EVERY`] (each under
/// `echo_deadline`), reading the stream in between, until `stop` resolves
/// (returns `None`) or the stream ends or fails (returns how).
pub async fn hold_open<S>(
    mut stream: S,
    stop: impl Future<Output = ()>,
    echo_deadline: Duration,
) -> Option<String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    tokio::pin!(stop);
    loop {
        let mut payload = [0u8; ECHO_PAYLOAD_BYTES];
        rand::thread_rng().fill_bytes(&mut payload);
        let ping = async {
            stream
                .write_all(&payload)
                .await
                .map_err(|e| format!("write: {:?}", e.kind()))?;
            stream
                .flush()
                .await
                .map_err(|e| format!("flush: {:?}", e.kind()))?;
            let mut back = [0u8; ECHO_PAYLOAD_BYTES];
            match stream.read_exact(&mut back).await {
                Ok(_) if back == payload => Ok(()),
                Ok(_) => Err("echo came back different".to_string()),
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err("closed".to_string()),
                Err(e) => Err(format!("read: {:?}", e.kind())),
            }
        };
        tokio::select! {
            () = &mut stop => return None,
            r = tokio::time::timeout(echo_deadline, ping) => match r {
                Err(_) => return Some("echo not returned".to_string()),
                Ok(Err(why)) => return Some(why),
                Ok(Ok(())) => {}
            },
        }
        let mut one = [0u8; 1];
        tokio::select! {
            () = &mut stop => return None,
            () = tokio::time::sleep(HOLD_PING_EVERY) => {}
            r = stream.read(&mut one) => {
                return Some(match r {
                    Ok(0) => "closed".to_string(),
                    Ok(_) => "unasked bytes".to_string(),
                    Err(e) => format!("read: {:?}", e.kind()),
                });
            }
        }
    }
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

/// Which routers a member holds and what last went wrong with one, as
/// PeerId strings: what a flap record shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// Routers with an active reservation.
    pub reserved: Vec<String>,
    /// Of the routers held, those that sent go-away.
    pub leaving: Vec<String>,
    /// The node's last router error (`NodeStatus::last_router_error`).
    pub last_router_error: Option<String>,
}

/// A running member.
pub struct Member {
    /// The node's PeerId.
    peer_id: String,
    /// `None` once shut down. Calls hold the read side; shutdown takes the handle.
    handle: RwLock<Option<agentmesh_node::NodeHandle>>,
    status: watch::Receiver<agentmesh_node::NodeStatus>,
    /// Moves on every change of the policy or revocations the node holds.
    policy: watch::Receiver<u64>,
    socket: Option<PathBuf>,
    deadlines: CallDeadlines,
}

impl Member {
    /// Starts the node; returns once it holds a credential (the node enrolls inside `spawn`).
    pub async fn start(spec: MemberSpec) -> Result<Self, String> {
        let socket = spec.data_dir.join(agentmesh_node::config::SOCKET_FILE);
        let config = agentmesh_node::Config {
            control_plane: node_config::ControlPlaneConfig {
                url: spec.control_plane,
                ca: spec.control_plane_ca,
                endpoints: spec.control_plane_endpoints,
                token: spec.token,
                ..Default::default()
            },
            data_dir: spec.data_dir,
            routers: node_config::RoutersConfig {
                count: spec.routers,
                rejoin_spread: spec.rejoin_spread,
                ..Default::default()
            },
            services: node_config::ServicesConfig {
                expose: spec
                    .expose_echo
                    .map(|a| {
                        std::iter::once(ECHO.to_string())
                            .chain(spec.expose_also.clone())
                            .map(|name| (name, a))
                            .collect()
                    })
                    .unwrap_or_default(),
                ..Default::default()
            },
            local: node_config::LocalConfig {
                no_socket: !spec.socket,
                socket_path: None,
                ..Default::default()
            },
            connections: node_config::ConnectionConfig {
                dial_source_ip: spec.dial_source_ip,
                ping_interval: spec.ping_interval,
                ..Default::default()
            },
            direct: node_config::DirectConfig {
                enabled: spec.direct,
                transport: spec.direct_transport,
                quic_idle_timeout: spec.quic_idle_timeout,
                ..Default::default()
            },
            call_timeout: spec.call_timeout,
            ..agentmesh_node::Config::default()
        };
        let deadlines = CallDeadlines::of(&config);
        let handle = agentmesh_node::spawn(config, None)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            peer_id: handle.peer_id().to_string(),
            status: handle.status(),
            policy: handle.policy_changes(),
            handle: RwLock::new(Some(handle)),
            socket: spec.socket.then_some(socket),
            deadlines,
        })
    }

    /// The node's PeerId.
    pub fn peer_id(&self) -> &str {
        &self.peer_id
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

    /// How long this member's calls may take, as the ladder waits for them.
    pub fn deadlines(&self) -> CallDeadlines {
        self.deadlines
    }

    /// One echo call through the mesh: random bytes out, the same bytes back.
    /// A failure says which phase failed (see [`CallFailure`]).
    pub async fn call_echo(&self) -> Result<EchoRoute, CallFailure> {
        let guard = self.handle.read().await;
        let handle = guard.as_ref().ok_or(CallFailure::ShutDown)?;
        echo_noting(handle.call(ECHO), self.deadlines, |s| EchoRoute {
            provider: s.route().provider.to_string(),
            direct: s.route().direct,
        })
        .await
    }

    /// Opens a call to `service` (its set-up under the call deadline) and
    /// returns the stream, for a call held open ([`hold_open`]).
    pub async fn open_call(
        &self,
        service: &str,
    ) -> Result<agentmesh_node::CallStream, CallFailure> {
        let guard = self.handle.read().await;
        let handle = guard.as_ref().ok_or(CallFailure::ShutDown)?;
        match tokio::time::timeout(self.deadlines.call, handle.call(service)).await {
            Err(_) => Err(CallFailure::CallNotReturned(self.deadlines.call)),
            Ok(Err(e)) => Err(CallFailure::Call(e.result_label())),
            Ok(Ok(s)) => Ok(s),
        }
    }

    /// The node's direct-connection counters as `upgrade:<result>`,
    /// `refused:<reason>`, `closed:<reason>`, `fallbacks`,
    /// `port_reuse_fallbacks`, `punches_timed`, `punches_within_1s`,
    /// `punches_within_2s` (from `punch_duration_seconds`) and `open` (see
    /// `agentmesh_node::NodeHandle::direct_counts`); `None` once shut down
    /// or while it is shutting down.
    pub fn direct_counts(&self) -> Option<BTreeMap<String, u64>> {
        let guard = self.handle.try_read().ok()?;
        let c = guard.as_ref()?.direct_counts();
        let upgrades = c.upgrades.iter().map(|(r, n)| (format!("upgrade:{r}"), *n));
        let refused = c
            .inbound_refused
            .iter()
            .map(|(r, n)| (format!("refused:{r}"), *n));
        // Cumulative buckets: the count at that bound.
        let within = |secs: f64| {
            c.punch_durations
                .iter()
                .find(|(le, _)| *le >= secs)
                .map_or(0, |(_, n)| *n)
        };
        let closed = c.closed.iter().map(|(r, n)| (format!("closed:{r}"), *n));
        let single = [
            ("fallbacks".to_string(), c.fallbacks),
            ("port_reuse_fallbacks".to_string(), c.port_reuse_fallbacks),
            ("punches_timed".to_string(), within(f64::INFINITY)),
            ("punches_within_1s".to_string(), within(1.0)),
            ("punches_within_2s".to_string(), within(2.0)),
            ("open".to_string(), c.open),
        ];
        Some(
            upgrades
                .chain(refused)
                .chain(closed)
                .chain(single)
                .collect(),
        )
    }

    /// The policy version the node holds (`None` once shut down).
    pub async fn policy_version(&self) -> Option<u64> {
        let guard = self.handle.read().await;
        guard.as_ref().map(|h| h.policy_version().1)
    }

    /// A receiver that moves on every change of the node's policy or revocations.
    pub fn policy_changes(&self) -> watch::Receiver<u64> {
        self.policy.clone()
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

    /// The routers held now and the last router error.
    pub fn held(&self) -> Held {
        let s = self.status.borrow();
        let ids =
            |v: &[agentmesh_proto::identity::PeerId]| v.iter().map(ToString::to_string).collect();
        Held {
            reserved: ids(&s.reserved),
            leaving: ids(&s.leaving),
            last_router_error: s.last_router_error.clone(),
        }
    }

    /// The panic that ended the node's core, if it did (an exit to count).
    pub fn failed(&self) -> Option<String> {
        self.status.borrow().failed.clone()
    }

    /// Waits for a change; `Err` when the node has ended.
    pub async fn changed(&mut self) -> Result<(), ()> {
        self.status.changed().await.map_err(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentmesh_node::CallError;
    use tokio::io::DuplexStream;

    /// Short deadlines: the waits below end on them, nothing asserts their length.
    const SHORT: CallDeadlines = CallDeadlines {
        call: Duration::from_millis(200),
        echo: Duration::from_millis(200),
    };

    /// A stream pair: ours goes to `echo_over`, the far end to `peer`.
    fn pair() -> (DuplexStream, DuplexStream) {
        tokio::io::duplex(1024)
    }

    async fn ready(s: DuplexStream) -> Result<DuplexStream, CallError> {
        Ok(s)
    }

    #[test]
    fn deadlines_cover_the_nodes_call_budget() {
        let config = agentmesh_node::Config::default();
        let d = CallDeadlines::of(&config);
        let budget = config.connect_timeout + config.call_timeout;
        assert!(d.call >= budget, "{d:?} < {budget:?}");
        assert_eq!(d.echo, config.call_timeout);
    }

    #[tokio::test]
    async fn call_errors_are_reported_by_kind() {
        let none = echo_over(
            async { Err::<DuplexStream, _>(CallError::NoProviders(ECHO.into())) },
            SHORT,
        )
        .await;
        assert_eq!(none, Err(CallFailure::Call("no_providers")));
        let timed_out = echo_over(
            async {
                Err::<DuplexStream, _>(CallError::Failed {
                    service: ECHO.into(),
                    attempts: 2,
                    last: "deadline".into(),
                    refused: false,
                    refusal: None,
                    timed_out: true,
                })
            },
            SHORT,
        )
        .await
        .expect_err("failed call");
        assert_eq!(timed_out.to_string(), "call: timeout");
    }

    #[tokio::test]
    async fn a_call_that_never_returns_is_not_an_echo_timeout() {
        let r = echo_over(
            std::future::pending::<Result<DuplexStream, CallError>>(),
            SHORT,
        )
        .await;
        assert_eq!(r, Err(CallFailure::CallNotReturned(SHORT.call)));
        assert!(
            r.expect_err("failed")
                .to_string()
                .starts_with("call did not return within")
        );
    }

    #[tokio::test]
    async fn an_accepted_call_whose_echo_never_comes_is_an_echo_timeout() {
        let (ours, _peer_stays_open_and_silent) = pair();
        let r = echo_over(ready(ours), SHORT).await;
        assert_eq!(r, Err(CallFailure::EchoNotReturned(SHORT.echo)));
        assert!(
            r.expect_err("failed")
                .to_string()
                .starts_with("echo not returned within")
        );
    }

    #[tokio::test]
    async fn stream_errors_name_the_operation_and_kind() {
        let (ours, mut peer) = pair();
        let far = tokio::spawn(async move {
            let mut got = [0u8; ECHO_PAYLOAD_BYTES];
            peer.read_exact(&mut got).await.expect("peer reads");
            // Closes without answering.
        });
        let r = echo_over(ready(ours), SHORT).await;
        far.await.expect("peer task");
        assert_eq!(
            r,
            Err(CallFailure::Io {
                op: "read",
                kind: io::ErrorKind::UnexpectedEof
            })
        );
        assert!(
            r.expect_err("failed")
                .to_string()
                .starts_with("stream read: ")
        );
    }

    #[tokio::test]
    async fn a_held_call_ends_when_stopped_or_when_the_far_end_closes() {
        let (ours, mut peer) = pair();
        let far = tokio::spawn(async move {
            // Answers two pings, then closes.
            for _ in 0..2 {
                let mut got = [0u8; ECHO_PAYLOAD_BYTES];
                peer.read_exact(&mut got).await.expect("peer reads");
                peer.write_all(&got).await.expect("peer echoes");
            }
        });
        let ended = hold_open(ours, std::future::pending(), SHORT.echo).await;
        far.await.expect("peer task");
        assert_eq!(ended.as_deref(), Some("closed"));

        let (ours, _peer) = pair();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        stop_tx.send(()).expect("stop");
        let ended = hold_open(ours, async { drop(stop_rx.await) }, SHORT.echo).await;
        assert_eq!(ended, None, "stopped by us, not ended");
    }

    #[tokio::test]
    async fn echo_round_trip_and_mismatch() {
        let (ours, mut peer) = pair();
        let far = tokio::spawn(async move {
            let mut got = [0u8; ECHO_PAYLOAD_BYTES];
            peer.read_exact(&mut got).await.expect("peer reads");
            peer.write_all(&got).await.expect("peer echoes");
        });
        assert_eq!(echo_over(ready(ours), SHORT).await, Ok(()));
        far.await.expect("peer task");

        let (ours, mut peer) = pair();
        let far = tokio::spawn(async move {
            let mut got = [0u8; ECHO_PAYLOAD_BYTES];
            peer.read_exact(&mut got).await.expect("peer reads");
            got[0] ^= 0xff;
            peer.write_all(&got).await.expect("peer answers");
        });
        assert_eq!(
            echo_over(ready(ours), SHORT).await,
            Err(CallFailure::Mismatch)
        );
        far.await.expect("peer task");
    }
}
