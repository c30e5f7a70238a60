//! Node-test harness: nodes started with `spawn` and what only node tests
//! need (node config, readiness, calls through a node). The shared parts (a
//! real control plane, in-process routers, the raw libp2p [`TestPeer`] used
//! to present bad credentials, an echo backend, metric helpers) come from
//! `agentmesh-testkit` and are re-exported so tests reach them as `support::…`.

#![allow(dead_code, unreachable_pub, unused_imports)]

pub use agentmesh_testkit::{
    ADMIN, Cp, DEADLINE, TestPeer, TestRouter as Router, echo_backend, eventually, http_get,
    metric, start_cp, start_cp_with,
};

pub mod binary;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use agentmesh_node::{Config, NodeHandle};
use rand::RngCore as _;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

/// A router labelled `name=NAME` on loopback TCP, leasing every second.
pub async fn start_router(cp: &Cp, name: &str) -> Router {
    start_router_with(cp, name, Duration::from_secs(1)).await
}

/// A router labelled `name=NAME` leasing (and reading the directory) every `lease_interval`.
pub async fn start_router_with(cp: &Cp, name: &str, lease_interval: Duration) -> Router {
    start_router_on(cp, name, lease_interval, "/ip4/127.0.0.1/tcp/0").await
}

/// A router listening on `listen` only.
pub async fn start_router_on(
    cp: &Cp,
    name: &str,
    lease_interval: Duration,
    listen: &str,
) -> Router {
    start_router_tweaked(cp, name, lease_interval, listen, |_| {}).await
}

/// A router as [`start_router_on`], its config changed by `tweak` before spawning.
pub async fn start_router_tweaked(
    cp: &Cp,
    name: &str,
    lease_interval: Duration,
    listen: &str,
    tweak: impl FnOnce(&mut agentmesh_router::Config),
) -> Router {
    Router::start(cp, &[("name", name)], |c| {
        c.listen = vec![listen.parse().expect("addr")];
        c.control_plane.lease_interval = lease_interval;
        tweak(c);
    })
    .await
}

/// A node config for tests: this control plane, K = 1 router, a 1 s
/// directory poll, metrics on loopback port 0, data in `dir`.
pub fn node_config(cp: &Cp, token: &str, dir: &Path) -> Config {
    Config {
        data_dir: dir.to_path_buf(),
        metrics_addr: Some("127.0.0.1:0".parse().expect("addr")),
        control_plane: agentmesh_node::config::ControlPlaneConfig {
            url: cp.url.clone(),
            token: token.to_string(),
            directory_interval: Duration::from_secs(1),
            ..Default::default()
        },
        routers: agentmesh_node::config::RoutersConfig {
            count: 1,
            ..Default::default()
        },
        ..Config::default()
    }
}

/// Spawns a node whose config is `adjust(node_config(..))` (`what` names
/// it if spawning fails), its data in a fresh temp dir returned alongside:
/// keep the dir alive as long as the node.
pub async fn spawn_node(
    cp: &Cp,
    token: &str,
    what: &str,
    adjust: impl FnOnce(Config) -> Config,
) -> (NodeHandle, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = agentmesh_node::spawn(adjust(node_config(cp, token, dir.path())), None)
        .await
        .expect(what);
    (node, dir)
}

/// A provider `b` exposing `echo` (on an echo backend) and a caller `a`,
/// members by `token`, their configs changed by `b_config` and `a_config`
/// (b's already exposes `echo`), spawned in that order and both ready.
/// Each comes with its data dir: keep it alive as long as the node.
pub async fn echo_pair(
    cp: &Cp,
    token: &str,
    b_config: impl FnOnce(Config) -> Config,
    a_config: impl FnOnce(Config) -> Config,
) -> (
    (NodeHandle, tempfile::TempDir),
    (NodeHandle, tempfile::TempDir),
) {
    let backend = echo_backend().await;
    let b = spawn_node(cp, token, "spawn b", |mut base| {
        base.services.expose = vec![("echo".into(), backend)];
        b_config(base)
    })
    .await;
    let a = spawn_node(cp, token, "spawn a", a_config).await;
    ready(&b.0, "b").await;
    ready(&a.0, "a").await;
    (b, a)
}

/// A member of a storm test: K = 2 routers, no metrics listener, no Unix
/// socket (many of them share one test process).
pub async fn storm_member(cp: &Cp, token: String) -> (NodeHandle, tempfile::TempDir) {
    spawn_node(cp, &token, "spawn", |mut c| {
        c.metrics_addr = None;
        c.routers.count = 2;
        c.local.no_socket = true;
        c
    })
    .await
}

/// Reserved on K = 2 routers, none of them in `gone`.
pub fn on_k(n: &NodeHandle, gone: &HashSet<libp2p::PeerId>) -> bool {
    let s = n.status().borrow().clone();
    s.reserved.len() >= 2 && !s.reserved.iter().any(|r| gone.contains(r))
}

/// A router selector matching `name=NAME`.
pub fn selector(name: &str) -> BTreeMap<String, String> {
    [("name".to_string(), name.to_string())].into()
}

/// Waits (up to [`DEADLINE`]) until `node` is ready; the panic shows its status.
pub async fn ready(node: &NodeHandle, what: &str) {
    assert!(
        node.wait_ready(DEADLINE).await,
        "{what} not ready: {:?}",
        node.status().borrow()
    );
}

/// Calls until a provider is found (the routers' DHT needs a moment to
/// learn a new record), up to the deadline.
pub async fn call_until_found(node: &NodeHandle, service: &str) -> agentmesh_node::CallStream {
    let end = Instant::now() + DEADLINE;
    loop {
        match node.call(service).await {
            Ok(s) => return s,
            Err(e) => {
                assert!(Instant::now() < end, "call {service} never succeeded: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Writes `payload` to `stream`, half-closes it and reads the answer to its
/// end (an echo backend sends `payload` back); no deadline of its own.
pub async fn exchange(
    stream: &mut agentmesh_node::CallStream,
    payload: &[u8],
) -> std::io::Result<Vec<u8>> {
    stream.write_all(payload).await?;
    stream.shutdown().await?;
    let mut back = Vec::new();
    stream.read_to_end(&mut back).await?;
    Ok(back)
}

/// Sends `before` through `stream` (to an echo backend) and reads it back,
/// starts stopping `node` (`what` names it) and waits until it says so,
/// then sends `after`, half-closes and asserts the whole echo came back:
/// an exchange in flight outlives the stop. Returns the stop's task.
pub async fn echo_across_a_stop<S>(
    stream: &mut S,
    node: NodeHandle,
    what: &str,
    before: &[u8],
    after: &[u8],
) -> tokio::task::JoinHandle<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    stream.write_all(before).await.expect("write");
    let mut got = vec![0u8; before.len()];
    stream.read_exact(&mut got).await.expect("read");
    let mut status = node.status();
    let stopping = tokio::spawn(node.shutdown());
    tokio::time::timeout(DEADLINE, status.wait_for(|s| s.stopping))
        .await
        .unwrap_or_else(|_| panic!("{what} not stopping in time"))
        .expect("status");
    stream.write_all(after).await.expect("write");
    stream.shutdown().await.expect("half-close");
    stream.read_to_end(&mut got).await.expect("read");
    assert_eq!(got, [before, after].concat());
    stopping
}

/// Sends `len` random bytes through `stream`, half-closes, and asserts the
/// echo came back whole and unchanged.
pub async fn round_trip(stream: &mut agentmesh_node::CallStream, len: usize) {
    let mut payload = vec![0u8; len];
    rand::thread_rng().fill_bytes(&mut payload);
    let (mut r, mut w) = tokio::io::split(stream);
    let send = async {
        w.write_all(&payload).await.expect("write");
        w.shutdown().await.expect("half-close");
    };
    let recv = async {
        let mut back = Vec::with_capacity(len);
        r.read_to_end(&mut back).await.expect("read");
        back
    };
    let ((), back) = tokio::join!(send, recv);
    assert_eq!(back.len(), payload.len(), "echo length");
    assert!(back == payload, "echo came back different");
}

/// A backend that reads one line, answers `got: LINE` and closes the
/// connection: its answer ends a call although the caller never closes its
/// side. Runs until the test process ends.
pub async fn one_line_backend() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut r = tokio::io::BufReader::new(s);
                let mut line = String::new();
                if r.read_line(&mut line).await.is_ok() {
                    let mut s = r.into_inner();
                    let _ = s.write_all(format!("got: {line}").as_bytes()).await;
                    let _ = s.shutdown().await;
                }
            });
        }
    });
    addr
}

/// GETs /readyz over the node's Unix socket; `None` if it cannot connect yet.
pub async fn socket_readyz(path: &Path) -> Option<String> {
    let mut u = tokio::net::UnixStream::connect(path).await.ok()?;
    u.write_all(b"GET /readyz HTTP/1.1\r\n\r\n").await.ok()?;
    let mut out = String::new();
    u.read_to_string(&mut out).await.ok()?;
    Some(out)
}

/// A backend whose connects hang: a loopback listener with a backlog of one
/// that never accepts, its queue filled, so the kernel drops every further
/// SYN. A provider exposing it neither accepts nor refuses a call until its
/// own connect timeout. Keep the returned value alive as long as the backend.
pub struct HangingBackend {
    /// The address to expose.
    pub addr: std::net::SocketAddr,
    _listener: tokio::net::TcpListener,
    _queued: Vec<tokio::net::TcpStream>,
}

/// Binds a [`HangingBackend`]: connects until one connect no longer
/// completes, twice in a row (set-up only: nothing is asserted on time).
pub async fn hanging_backend() -> HangingBackend {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let listener = socket.listen(1).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let mut queued = Vec::new();
    let mut stalled = 0;
    while stalled < 2 {
        assert!(queued.len() < 64, "the backlog never filled");
        match tokio::time::timeout(
            Duration::from_millis(300),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(s)) => {
                stalled = 0;
                queued.push(s);
            }
            Ok(Err(e)) => panic!("connect to the hanging backend: {e}"),
            Err(_) => stalled += 1,
        }
    }
    HangingBackend {
        addr,
        _listener: listener,
        _queued: queued,
    }
}

/// A backend that never writes a byte and never closes (a long-poll with
/// nothing to say, that ignores a half-close): it accepts every
/// connection, reads and discards what comes, and keeps its end open until
/// the test process ends. What it counts is the other side: how many
/// connections to it the provider still holds a socket for (read from
/// `/proc/self/net/tcp`, where a socket no process holds any more shows
/// inode 0; the provider runs in the test's process), so a provider that
/// only half-closes its side does not count as having closed it.
pub struct SilentBackend {
    /// The address to expose.
    pub addr: std::net::SocketAddr,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl SilentBackend {
    /// Binds on 127.0.0.1:0 and serves in a task.
    pub async fn start() -> Self {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = l.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let a = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                    // Half-closed or closed by the provider: hold on.
                    std::future::pending::<()>().await;
                    drop(s);
                });
            }
        });
        Self { addr, accepted }
    }

    /// Connections to the backend whose socket a process (the provider)
    /// still holds.
    pub fn open(&self) -> usize {
        let std::net::SocketAddr::V4(v4) = self.addr else {
            panic!("the backend binds IPv4");
        };
        let want = format!(
            "{:08X}:{:04X}",
            u32::from_ne_bytes(v4.ip().octets()),
            v4.port()
        );
        let table = std::fs::read_to_string("/proc/self/net/tcp").expect("read /proc/self/net/tcp");
        table
            .lines()
            .skip(1)
            .filter(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.get(2) == Some(&want.as_str())
                    && cols.get(9).is_some_and(|inode| *inode != "0")
            })
            .count()
    }

    /// Connections accepted since start.
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}
