//! Measures what an idle member's connection costs the router: RSS of a
//! real `agentmesh-router` child process (its log on stderr names its
//! addresses) before and after N idle connections (noise + yamux, identify
//! exchanged, a ping stream each way as a member keeps them; not
//! authenticated, which needs a control plane), divided by N. Asserts that
//! the default idle member charge (connection charge + two ping streams)
//! covers the measurement and that the ping streams were there; prints the
//! number (recorded in docs/scalability.md and at
//! `DEFAULT_CONNECTION_CHARGE_BYTES`). Then closes every connection,
//! asserts the router's per-connection tables are empty
//! (`agentmesh_router_table_entries`, `agentmesh_router_connections_charged`)
//! and prints the RSS before, at the peak and after they left, with
//! jemalloc's allocated / resident bytes.

use crate::support;

use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use libp2p::swarm::NetworkBehaviour;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::{Multiaddr, PeerId, SwarmBuilder, identify, noise, ping, tcp, yamux};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Idle connections opened.
const CONNECTIONS: usize = 200;

/// The whole measurement finishes within this or fails, below the CI
/// backstop (nextest's `ci` profile ends a test after 8 × 60 s): every wait
/// below has its own deadline, this bounds their sum.
const BUDGET: Duration = Duration::from_secs(300);

/// RSS readings while it settles with the connections open (500 ms apart).
const SETTLE_READINGS: usize = 120;

/// Readings (500 ms apart, so longer than jemalloc's 10 s decay) that
/// must agree within 1% for the RSS to count as settled.
const SETTLED_WINDOW: usize = 24;

/// RSS readings after everyone left (12 s apart: jemalloc's decay).
const GONE_READINGS: usize = 5;

/// `line` without terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

/// What a member runs besides our protocols: identify and ping.
#[derive(NetworkBehaviour)]
#[behaviour(prelude = "libp2p::swarm::derive_prelude")]
struct IdleMember {
    identify: identify::Behaviour,
    ping: ping::Behaviour,
}

type PeerSwarm = libp2p::Swarm<IdleMember>;

/// `/metrics` of the router at `addr`, read while `swarm` keeps running.
async fn scrape(swarm: &mut PeerSwarm, addr: std::net::SocketAddr) -> String {
    let get = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    };
    tokio::pin!(get);
    loop {
        tokio::select! {
            text = &mut get => return text,
            _ = swarm.select_next_some() => {}
        }
    }
}

/// Scrapes `/metrics` (driving `swarm`) until `done` holds for its body;
/// panics with `what` and the last body after the test deadline.
async fn scrape_until(
    swarm: &mut PeerSwarm,
    addr: std::net::SocketAddr,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let end = tokio::time::Instant::now() + support::DEADLINE;
    loop {
        let text = scrape(swarm, addr).await;
        let body = text.split("\r\n\r\n").nth(1).unwrap_or(&text).to_string();
        if done(&body) {
            return body;
        }
        assert!(tokio::time::Instant::now() < end, "{what}:\n{body}");
        let tick = tokio::time::sleep(Duration::from_millis(200));
        tokio::pin!(tick);
        loop {
            tokio::select! {
                _ = &mut tick => break,
                _ = swarm.select_next_some() => {}
            }
        }
    }
}

/// Drives `swarm` while polling RSS until two readings `every` apart differ
/// by less than 1% (at most `readings` readings; then the last one).
async fn settled_rss(swarm: &mut PeerSwarm, pid: u32, every: Duration, readings: usize) -> u64 {
    // Settled: no reading in the last `SETTLED_WINDOW` readings differs
    // from the others by 1% or more. Two readings alike were not enough:
    // memory freed after the handshakes stays resident until jemalloc's
    // decay (about 10 s) returns it, and under load the decay lags, so a
    // pair of readings 500 ms apart could agree while still holding it.
    let mut window: std::collections::VecDeque<u64> = std::collections::VecDeque::new();
    window.push_back(rss_bytes(pid));
    for _ in 0..readings {
        let tick = tokio::time::sleep(every);
        tokio::pin!(tick);
        loop {
            tokio::select! {
                _ = &mut tick => break,
                _ = swarm.select_next_some() => {}
            }
        }
        window.push_back(rss_bytes(pid));
        if window.len() > SETTLED_WINDOW {
            window.pop_front();
        }
        let (lo, hi) = (
            window.iter().copied().min().unwrap_or(0),
            window.iter().copied().max().unwrap_or(0),
        );
        if window.len() == SETTLED_WINDOW && (hi - lo) * 100 < lo {
            return lo;
        }
    }
    window.iter().copied().min().unwrap_or(0)
}

/// Drives `swarm` until it has `n` established connections.
async fn until_established(swarm: &mut PeerSwarm, n: usize) {
    let end = tokio::time::Instant::now() + support::DEADLINE;
    while (swarm.network_info().connection_counters().num_established() as usize) < n {
        let _ = tokio::time::timeout_at(end, swarm.select_next_some())
            .await
            .expect("connections established in time");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connection_costs_less_than_its_charge() {
    tokio::time::timeout(BUDGET, measure())
        .await
        .unwrap_or_else(|_| panic!("the measurement did not finish within {BUDGET:?}"));
}

/// The measurement (see the module doc); the router child is killed when
/// this returns or is dropped at the [`BUDGET`].
async fn measure() {
    support::init_tracing();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentmesh-router"))
        .args([
            "--control-plane",
            "http://127.0.0.1:9",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
            "--auth-deadline-secs",
            "600",
            "--unauthenticated-connections-per-ip",
            "100000",
            // All connections come from one test peer: let each keep its
            // ping stream (the per-peer budgets assume one connection).
            "--peer-stream-budget-total",
            "100000",
            "--peer-stream-budget",
            "ping=100000",
            "--peer-stream-budget",
            "identify=100000",
            "--metrics-addr",
            "127.0.0.1:0",
            "--key-path",
        ])
        .arg(dir.path().join("router.key"))
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("router binary");
    let pid = child.id().expect("pid");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let (peer, addr, metrics) = tokio::time::timeout(support::DEADLINE, async {
        let mut started = None;
        while let Some(line) = lines.next_line().await.expect("read") {
            let line = strip_ansi(&line);
            // "metrics on http://ADDR" follows "router started".
            if let Some(m) = line.split("metrics on http://").nth(1) {
                let m = m.trim().parse().expect("metrics addr");
                let (id, a) = started.expect("router started before its metrics line");
                return (id, a, m);
            }
            if line.contains("router started") {
                let id = line
                    .split("peer_id=")
                    .nth(1)
                    .and_then(|s| s.split_whitespace().next());
                let a = line
                    .split("listen=[")
                    .nth(1)
                    .and_then(|s| s.split([']', ',']).next());
                if let (Some(id), Some(a)) = (id, a) {
                    started = Some((
                        id.parse::<PeerId>().expect("peer id"),
                        a.trim().parse::<Multiaddr>().expect("addr"),
                    ));
                }
            }
        }
        panic!("router exited before listening");
    })
    .await
    .expect("router listening in time");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    let mut swarm: PeerSwarm = SwarmBuilder::with_new_identity()
        .with_tokio()
        .with_tcp(
            tcp::Config::default(),
            noise::Config::new,
            yamux::Config::default,
        )
        .expect("tcp")
        .with_behaviour(|key| IdleMember {
            identify: identify::Behaviour::new(identify::Config::new(
                "/agentmesh/1".into(),
                key.public(),
            )),
            ping: ping::Behaviour::default(),
        })
        .expect("behaviour")
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(600)))
        .build();
    let dial = |swarm: &mut PeerSwarm| {
        swarm
            .dial(
                DialOpts::peer_id(peer)
                    .addresses(vec![addr.clone()])
                    .condition(PeerCondition::Always)
                    .build(),
            )
            .expect("dial");
    };
    // Warm-up connections so one-time allocations are in the baseline.
    for _ in 0..8 {
        dial(&mut swarm);
    }
    until_established(&mut swarm, 8).await;
    let before = settled_rss(&mut swarm, pid, Duration::from_millis(500), SETTLE_READINGS).await;
    for _ in 0..CONNECTIONS {
        dial(&mut swarm);
    }
    until_established(&mut swarm, 8 + CONNECTIONS).await;
    // Every measured connection holds its ping streams (one each way)
    // before the reading: ping opens them a moment after the connection,
    // later still on a loaded machine (bounded wait).
    let ping =
        |dir: &str| format!("agentmesh_router_streams{{protocol=\"ping\",direction=\"{dir}\"}}");
    scrape_until(
        &mut swarm,
        metrics,
        "ping streams on every connection",
        |body| {
            ["inbound", "outbound"]
                .iter()
                .all(|d| support::metric(body, &ping(d)) >= CONNECTIONS as f64)
        },
    )
    .await;
    let after = settled_rss(&mut swarm, pid, Duration::from_millis(500), SETTLE_READINGS).await;
    let per_connection = after.saturating_sub(before) / CONNECTIONS as u64;
    println!(
        "router RSS {before} -> {after} bytes over {CONNECTIONS} idle connections: {per_connection} bytes per connection"
    );
    assert!(after > before, "connections cost something");
    // The measured connections still hold their ping streams.
    let text = scrape(&mut swarm, metrics).await;
    for dir in ["inbound", "outbound"] {
        let series = ping(dir);
        let n = support::metric(text.split("\r\n\r\n").nth(1).unwrap_or(&text), &series);
        println!("{series} {n}");
        assert!(
            n >= CONNECTIONS as f64,
            "{series} = {n}: ping streams measured"
        );
    }
    let charge = agentmesh_router::Config::default()
        .sizing(1 << 30)
        .idle_member_charge_bytes;
    println!("default idle member charge: {charge} bytes");
    assert!(
        per_connection <= charge,
        "the default idle member charge ({charge} bytes) covers the measured {per_connection} bytes"
    );

    // Everyone leaves: every per-connection table of the router empties
    // (an invariant, asserted), and the RSS it keeps is printed (measured,
    // not asserted: RSS depends on the allocator and the machine).
    let series = "agentmesh_router_table_entries{table=\"connections\"}";
    scrape_until(
        &mut swarm,
        metrics,
        "the connections table counts them",
        |b| support::metric(b, series) >= CONNECTIONS as f64,
    )
    .await;
    let peak = rss_bytes(pid);
    let _ = swarm.disconnect_peer_id(peer);
    let end = tokio::time::Instant::now() + support::DEADLINE;
    while swarm.network_info().connection_counters().num_established() > 0 {
        let _ = tokio::time::timeout_at(end, swarm.select_next_some())
            .await
            .expect("connections closed in time");
    }
    let zero = [
        "agentmesh_router_connections_charged",
        "agentmesh_router_table_entries{table=\"connections\"}",
        "agentmesh_router_table_entries{table=\"resource_peers\"}",
        "agentmesh_router_table_entries{table=\"resource_sources\"}",
        "agentmesh_router_table_entries{table=\"resource_peer_ips\"}",
        "agentmesh_router_table_entries{table=\"resource_pending\"}",
        "agentmesh_router_table_entries{table=\"admission\"}",
        "agentmesh_router_table_entries{table=\"reservations\"}",
    ];
    let left = |body: &str| -> Vec<(&str, f64)> {
        zero.iter()
            .map(|s| (*s, support::metric(body, s)))
            .filter(|(_, n)| *n != 0.0)
            .collect()
    };
    let body = scrape_until(
        &mut swarm,
        metrics,
        "tables still hold entries after every connection closed",
        |b| left(b).is_empty(),
    )
    .await;
    assert!(left(&body).is_empty(), "{:?}", left(&body));
    // jemalloc purges freed pages over its 10 s decay, starting when its
    // background thread next wakes: compare readings 12 s apart.
    let gone = settled_rss(&mut swarm, pid, Duration::from_secs(12), GONE_READINGS).await;
    let text = scrape(&mut swarm, metrics).await;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or(&text);
    let alloc: Vec<String> = ["allocated", "active", "resident", "retained", "metadata"]
        .iter()
        .map(|k| {
            let n = support::metric(body, &format!("agentmesh_runtime_allocator_{k}_bytes"));
            format!("{k} {n}")
        })
        .collect();
    println!(
        "after all {CONNECTIONS} left: RSS {before} (before) -> {peak} (peak) -> {gone} (after) bytes, {:.2}x before; jemalloc: {}",
        gone as f64 / before as f64,
        alloc.join(", ")
    );
    let _ = child.kill().await;
}
