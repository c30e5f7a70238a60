//! A member's log does not grow with what a peer sends it: the node
//! binary (its own default log filter, stderr read to the end) attached to
//! a real router, and an enrolled member of the hostile harness
//! (`member_noise`) that opens thousands of policy push and go-away streams
//! to it over one relayed circuit. A member takes those only from its
//! routers, so it refuses every one, counts it, and logs it: each kind
//! about one peer at most once a minute, the lines held back counted in
//! `agentmesh_node_log_suppressed_total{kind}`. Before, every refusal was a
//! WARN line (20,000 of each once added 716 KB to a member's log in a
//! fraction of a second).

use super::support;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentmesh_hostile::member_noise::{self, Attack, Progress};
use agentmesh_proto::pb::credential::Role;
use libp2p::PeerId;
use libp2p::identity::Keypair;
use support::binary::{NODE_EXE, sigterm, socket_ready, token_file};
use support::*;
use tokio::io::AsyncBufReadExt as _;
use tokio::process::Command;

/// Streams the attacker opens per protocol.
const STREAMS: usize = 3_000;
/// Of those, refusals each kind must have counted at least: most reach
/// the member's loop (the rest are dropped by its bounded stream queue,
/// counted apart), so the attack ran.
const MIN_REFUSED: f64 = 500.0;
/// Lines about the attacker the log may hold: two kinds (push refused,
/// go-away ignored), each at most twice (once, and once more should the
/// attack straddle a minute).
const MAX_LINES: usize = 4;

/// Collects every stderr line of the child until it exits.
fn collect_stderr(
    child: &mut tokio::process::Child,
) -> (Arc<Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let stderr = child.stderr.take().expect("stderr piped");
    let sink = lines.clone();
    let task = tokio::spawn(async move {
        let mut r = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = r.next_line().await {
            sink.lock().expect("lines").push(line);
        }
    });
    (lines, task)
}

/// The first line that `find` makes something of, waiting up to the deadline.
async fn find_line<T>(
    lines: &Arc<Mutex<Vec<String>>>,
    what: &str,
    find: impl Fn(&str) -> Option<T>,
) -> T {
    eventually(what, || async {
        lines.lock().expect("lines").iter().find_map(|l| find(l))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_pushes_and_goaways_from_one_peer_are_logged_once_a_minute() {
    let cp = start_cp().await;
    let r = start_router(&cp, "r1").await;
    let token = cp.token(Role::Member).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("node");
    let tokens = token_file(dir.path(), &token).await;
    let backend = echo_backend().await;
    let mut node = Command::new(NODE_EXE)
        .args(["run", "--control-plane", &cp.url, "--routers", "1"])
        .args(["--directory-interval-secs", "1"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .args(["--expose", &format!("echo={backend}")])
        .arg("--token-file")
        .arg(&tokens)
        .arg("--data-dir")
        .arg(&data)
        // The filter an operator gets.
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run the node binary");
    let (lines, reader) = collect_stderr(&mut node);
    let target: PeerId = find_line(&lines, "the node's PeerId logged", |l| {
        l.contains("node running")
            .then(|| {
                l.split_once("peer=")?
                    .1
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .flatten()
    })
    .await;
    let metrics: std::net::SocketAddr =
        find_line(&lines, "the node's metrics address logged", |l| {
            l.split_once("metrics on http://")?.1.trim().parse().ok()
        })
        .await;
    socket_ready(&data).await;

    let key = Keypair::generate_ed25519();
    let attacker = key.public().to_peer_id();
    let credential = cp.member_credential(&key).await;
    let attack = Attack {
        router: r.id(),
        router_addr: r.addr.clone(),
        target,
        streams: STREAMS,
        in_flight: 32,
        // A bound, not the plan: the streams open in seconds.
        duration: Duration::from_secs(40),
    };
    let report = member_noise::run(&attack, key, credential, Arc::new(Progress::default()))
        .await
        .expect("attack set-up");
    eprintln!("attack: {report}");
    assert_eq!(report.circuits, 1, "{report}");
    assert!(report.pushes >= MIN_REFUSED as u64, "{report}");
    assert!(report.goaways >= MIN_REFUSED as u64, "{report}");

    let series = |m: &str, s: &str| metric(m, s);
    let m = eventually("the member counted the refusals", || async {
        let (_, m) = http_get(metrics, "/metrics").await;
        let pushes = series(
            &m,
            r#"agentmesh_node_policy_pushes_total{result="not_attached"}"#,
        );
        let goaways = series(&m, r#"agentmesh_node_goaways_total{result="ignored"}"#);
        (pushes >= MIN_REFUSED && goaways >= MIN_REFUSED).then_some(m)
    })
    .await;
    let pushes = series(
        &m,
        r#"agentmesh_node_policy_pushes_total{result="not_attached"}"#,
    );
    let goaways = series(&m, r#"agentmesh_node_goaways_total{result="ignored"}"#);
    // Read after `m`: a refusal and its held-back line are counted
    // together, so what this says held back covers every refusal `m` saw.
    let (_, later) = http_get(metrics, "/metrics").await;

    // Every line the member wrote, to the end.
    sigterm(&mut node).await;
    reader.await.expect("stderr reader");
    let lines = lines.lock().expect("lines").clone();
    let about: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains(&attacker.to_string()))
        .collect();
    let bytes: usize = about.iter().map(|l| l.len() + 1).sum();
    eprintln!(
        "{} lines ({bytes} bytes) about the attacker after {pushes} pushes and {goaways} go-aways refused",
        about.len()
    );
    assert!(
        about.len() <= MAX_LINES,
        "{} lines about the attacker, e.g. {:?}",
        about.len(),
        about.iter().take(3).collect::<Vec<_>>()
    );
    for (kind, refused) in [
        ("policy_push_not_attached", pushes),
        ("goaway_ignored", goaways),
    ] {
        let logged = about
            .iter()
            .filter(|l| {
                l.contains(if kind.starts_with("policy") {
                    "policy push"
                } else {
                    "go-away"
                })
            })
            .count();
        assert!(logged >= 1, "the first {kind} is logged: {about:?}");
        // The rest are held back and counted.
        let held = series(
            &later,
            &format!(r#"agentmesh_node_log_suppressed_total{{kind="{kind}"}}"#),
        );
        assert!(
            held >= refused - MAX_LINES as f64,
            "{kind}: {held} held back of {refused} refused"
        );
    }
    // Every kind is there from the start, at 0 or more.
    for kind in ["goaway_overflow", "policy_push_overflow", "call_refused"] {
        let s = format!(r#"agentmesh_node_log_suppressed_total{{kind="{kind}"}}"#);
        assert!(later.contains(&s), "{s} missing");
    }
}
