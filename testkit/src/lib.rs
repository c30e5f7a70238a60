//! Test harness shared by the router tests, the cross-program tests and a
//! few unit tests: a real control plane (SQLite in a temp dir), routers
//! started in-process, a raw libp2p peer that speaks the mesh protocols by
//! hand, an echo backend and small helpers to read metrics and wait on
//! conditions.
//!
//! Why a crate: the router's tests and the cross-program tests
//! (`agentmesh-e2e`) need exactly these parts, and keeping one copy means a
//! protocol or config change is fixed once. It is a dev-dependency only
//! (`publish = false`); no library depends on it. The in-process routers
//! are behind the `router` feature, so the node's unit tests (which use
//! only the small helpers) never build the router.

mod cp;
mod peer;
#[cfg(feature = "router")]
mod router;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

/// The signing fixtures every crate's tests share: a control plane's key
/// and trust, signed policies, revocation lists and member credentials.
pub use agentmesh_proto::testing as fixtures;
pub use cp::{ADMIN, Cp, start_cp, start_cp_with};
pub use peer::{Ev, Frozen, PeerBehaviour, TestPeer};
#[cfg(feature = "router")]
pub use router::{TestRouter, spawn_ready};

/// Generous deadline for every wait in the tests: long enough for a loaded
/// two-core machine, so a test fails on a missing event, never on speed.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Installs a test log subscriber once (`RUST_LOG` overrides
/// `default_filter`); output goes through the test writer so it shows only
/// for failing tests.
pub fn init_tracing(default_filter: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_test_writer()
        .try_init();
}

/// Polls `f` every 100 ms until it returns `Some`, panicking after
/// [`DEADLINE`]: the one way tests wait on a condition (no fixed sleeps).
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of one series (`name{labels}`, exactly as exposed) in
/// Prometheus text, or 0 when absent: tests assert on counters by name.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            (k == series).then(|| v.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

/// UDP sockets of this network namespace bound to `ip` (from
/// `/proc/self/net/udp`; the kernel prints the address in memory order):
/// how tests see which sockets a member opened from its source IP.
pub fn udp_sockets_on(ip: std::net::Ipv4Addr) -> usize {
    let want = format!("{:08X}:", u32::from_ne_bytes(ip.octets()));
    let table = std::fs::read_to_string("/proc/self/net/udp").expect("read /proc/self/net/udp");
    table
        .lines()
        .skip(1)
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|local| local.starts_with(&want))
        })
        .count()
}

/// A loopback TCP port free now (bound once, then released): for a
/// program the test starts on it, or as an address nothing answers on.
///
/// Picked at random below the kernel's ephemeral range: a port the kernel
/// handed out for `:0` could be taken, between this check and the
/// program's own bind, as the source port of any connection another test
/// opens (seen in CI: a control-plane replica failing with "Address
/// already in use"). Below that range only another explicit bind can take
/// it. Where the range leaves no room below it, the kernel's choice.
pub fn free_tcp_port() -> u16 {
    free_port(|port| std::net::TcpListener::bind(("127.0.0.1", port))?.local_addr())
}

/// [`free_tcp_port`] for UDP.
pub fn free_udp_port() -> u16 {
    free_port(|port| std::net::UdpSocket::bind(("127.0.0.1", port))?.local_addr())
}

/// A port `bind` succeeds on (bound, then released).
fn free_port(bind: impl Fn(u16) -> std::io::Result<SocketAddr>) -> u16 {
    use rand::Rng as _;
    let low = ephemeral_low().unwrap_or(0);
    if low > FIXED_PORTS_FROM + 1024 {
        let mut rng = rand::thread_rng();
        for _ in 0..64 {
            let port = rng.gen_range(FIXED_PORTS_FROM..low);
            if bind(port).is_ok() {
                return port;
            }
        }
    }
    bind(0).expect("free port").port()
}

/// The lowest port [`free_tcp_port`] picks: above the well-known and most
/// registered services' ports.
const FIXED_PORTS_FROM: u16 = 20_000;

/// The first port of the kernel's ephemeral range (`None`: unknown), read
/// once.
fn ephemeral_low() -> Option<u16> {
    static LOW: std::sync::OnceLock<Option<u16>> = std::sync::OnceLock::new();
    *LOW.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// A TCP echo backend on 127.0.0.1:0 (a real socket a node exposes as a
/// service); each connection is echoed until the caller half-closes.
pub async fn echo_backend() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// Reads a spawned program's stderr (piped) line by line until `find`
/// returns `Some` for a line, within [`DEADLINE`] (`what` names the line in
/// the panic); then keeps draining stderr in a task so the child never
/// blocks on a full pipe. Tests learn a binary's addresses and peer id
/// from its log this way.
pub async fn scan_stderr<T>(
    child: &mut tokio::process::Child,
    what: &str,
    mut find: impl FnMut(&str) -> Option<T>,
) -> T {
    use tokio::io::AsyncBufReadExt as _;
    let stderr = child.stderr.take().expect("stderr piped");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let end = Instant::now() + DEADLINE;
    let found = loop {
        let line = tokio::time::timeout_at(end, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("{what} logged in time"))
            .expect("read stderr")
            .expect("program exited early");
        if let Some(v) = find(&line) {
            break v;
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    found
}

/// A plain HTTP/1.1 GET over a real TCP connection (`connection: close`),
/// so tests read `/metrics`, `/readyz` and `/healthz` as a scraper would.
/// Returns the status code (0 if unparsable) and the whole response.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_request(addr, "GET", path).await
}

/// As [`http_get`], a `POST` with an empty body (`POST /drain`).
pub async fn http_post(addr: SocketAddr, path: &str) -> (u16, String) {
    http_request(addr, "POST", path).await
}

async fn http_request(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    exchange(addr, method, path)
        .await
        .unwrap_or_else(|e| panic!("{method} {path} on {addr}: {e}"))
}

/// As [`http_get`] for a server that may be gone or frozen (a killed or
/// stopped process): `None` when nothing answers within `within`.
pub async fn try_http_get(addr: SocketAddr, path: &str, within: Duration) -> Option<(u16, String)> {
    tokio::time::timeout(within, exchange(addr, "GET", path))
        .await
        .ok()?
        .ok()
}

/// One request and its whole answer: the status code (0 if unparsable)
/// and the response.
async fn exchange(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        format!(
            "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, out))
}
