//! Nodes in a real mesh on loopback: a real control plane (SQLite in a temp
//! dir), real routers started with `spawn`, nodes started with `spawn` and as
//! the real binary. Waits are on conditions with a generous deadline.

use super::support;

use std::time::Duration;

use agentmesh_node::CallError;
use agentmesh_proto::pb::credential::Role;
use support::binary::*;
use support::*;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_on_r1_calls_b_on_r2_through_transit_and_a_relay() {
    let cp = start_cp().await;
    let r1 = start_router(&cp, "r1").await;
    let r2 = start_router(&cp, "r2").await;
    let member = cp.token(Role::Member).await;
    let backend = echo_backend().await;

    let (b, _bdir) = spawn_node(&cp, &member, "spawn b", |mut base| {
        base.routers.selector = selector("r2");
        base.services.expose = vec![("echo".into(), backend), ("secret".into(), backend)];
        base.services.allow = vec!["secret=label:team=x".parse().expect("rule")];
        base
    })
    .await;
    let (a, adir) = spawn_node(&cp, &member, "spawn a", |mut base| {
        base.routers.selector = selector("r1");
        base.local.forward = vec![("127.0.0.1:0".parse().expect("addr"), "echo".into())];
        base
    })
    .await;
    ready(&b, "b").await;
    ready(&a, "a").await;
    assert_eq!(a.status().borrow().reserved, vec![r1.handle.peer_id()]);
    assert_eq!(b.status().borrow().reserved, vec![r2.handle.peer_id()]);

    // A shares no router with B: transit to R2, circuit through R2.
    let mut s = call_until_found(&a, "echo").await;
    assert_eq!(s.route().provider, b.peer_id());
    assert_eq!(s.route().via_router, r2.handle.peer_id());
    assert!(s.route().transit, "route: {:?}", s.route());
    round_trip(&mut s, 1 << 20).await;
    drop(s);
    // `agentmesh-node ping` tells the same route: through R2, for transit.
    let (ok, out, err) = node_cli(&["ping", "echo", "--count", "1", "--json"], adir.path()).await;
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim_end()).expect("ping JSON");
    assert_eq!(v["verdict"], "granted", "{v}");
    assert_eq!(v["route"]["transit"], true, "{v}");
    assert_eq!(v["route"]["router"], r2.handle.peer_id().to_string(), "{v}");
    let (ok, out, err) = node_cli(&["ping", "echo", "--count", "1"], adir.path()).await;
    assert!(ok, "{err}");
    assert!(out.contains(" (relayed, transit) in "), "{out}");

    // The allow rule refuses A (no team=x label), with a reason.
    match a.call("secret").await {
        Err(e @ CallError::Failed { refused: true, .. }) => {
            assert!(e.to_string().contains("NOT_ALLOWED"), "{e}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // Nobody provides this one.
    assert!(matches!(
        a.call("nope").await,
        Err(CallError::NoProviders(_))
    ));

    // --forward: a local TCP connection becomes a call.
    let mut t = tokio::net::TcpStream::connect(a.forward_addrs()[0])
        .await
        .expect("forward");
    t.write_all(b"through the forward\n").await.expect("write");
    let mut line = String::new();
    tokio::io::BufReader::new(&mut t)
        .read_line(&mut line)
        .await
        .expect("read");
    assert_eq!(line, "through the forward\n");
    drop(t);

    // The Unix socket: readiness and a call.
    let sock = a.socket_path().expect("socket").to_path_buf();
    let mut u = tokio::net::UnixStream::connect(&sock).await.expect("unix");
    u.write_all(b"GET /readyz HTTP/1.1\r\n\r\n")
        .await
        .expect("write");
    let mut out = String::new();
    u.read_to_string(&mut out).await.expect("read");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let mut u = tokio::net::UnixStream::connect(&sock).await.expect("unix");
    u.write_all(b"CALL echo\nhello over the socket")
        .await
        .expect("write");
    u.shutdown().await.expect("half-close");
    let mut out = String::new();
    u.read_to_string(&mut out).await.expect("read");
    assert_eq!(out, "OK\nhello over the socket");

    // Metrics and /readyz over HTTP.
    let (code, body) = http_get(a.metrics_addr().expect("metrics"), "/readyz").await;
    assert_eq!(code, 200, "{body}");
    let (_, am) = http_get(a.metrics_addr().expect("metrics"), "/metrics").await;
    assert!(
        metric(
            &am,
            r#"agentmesh_node_calls_total{direction="outbound",result="ok"}"#
        ) >= 3.0,
        "{am}"
    );
    assert_eq!(
        metric(
            &am,
            r#"agentmesh_node_calls_total{direction="outbound",result="refused"}"#
        ),
        1.0
    );
    assert_eq!(metric(&am, "agentmesh_node_routers_attached"), 1.0);
    let (_, bm) = http_get(b.metrics_addr().expect("metrics"), "/metrics").await;
    assert!(
        metric(
            &bm,
            r#"agentmesh_node_calls_total{direction="inbound",result="accepted"}"#
        ) >= 3.0,
        "{bm}"
    );
    assert_eq!(
        metric(
            &bm,
            r#"agentmesh_node_calls_total{direction="inbound",result="not_allowed"}"#
        ),
        1.0
    );
    assert!(
        metric(
            &bm,
            r#"agentmesh_node_call_bytes_total{direction="received"}"#
        ) >= f64::from(1u32 << 20)
    );

    // A member sharing B's router calls without transit.
    let (c, _cdir) = spawn_node(&cp, &member, "spawn c", |mut base| {
        base.routers.selector = selector("r2");
        base
    })
    .await;
    ready(&c, "c").await;
    let mut s = call_until_found(&c, "echo").await;
    assert!(!s.route().transit, "route: {:?}", s.route());
    assert_eq!(s.route().via_router, r2.handle.peer_id());
    round_trip(&mut s, 4096).await;
    drop(s);

    // Restart A with the same data dir and no token: same identity, no
    // re-enrollment (it could not enroll without a token), ready again.
    let a_id = a.peer_id();
    a.shutdown().await;
    let a2 = agentmesh_node::spawn(
        {
            let mut c = node_config(&cp, "", adir.path());
            c.routers.selector = selector("r1");
            c
        },
        None,
    )
    .await
    .expect("restart a");
    assert_eq!(a2.peer_id(), a_id);
    ready(&a2, "a restarted").await;
    let mut s = call_until_found(&a2, "echo").await;
    round_trip(&mut s, 1024).await;
    drop(s);

    a2.shutdown().await;
    c.shutdown().await;
    b.shutdown().await;
    r1.handle.shutdown().await;
    r2.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_router_dies_reattaches_elsewhere() {
    let cp = start_cp().await;
    let r1 = start_router(&cp, "r1").await;
    let r2 = start_router(&cp, "r2").await;
    let member = cp.token(Role::Member).await;
    let (n, _dir) = spawn_node(&cp, &member, "spawn", |mut base| {
        // Outgoing TCP from another loopback address, as the ladder does.
        base.connections.dial_source_ip = Some("127.0.0.3".parse().expect("ip"));
        base
    })
    .await;
    ready(&n, "n").await;
    let first = n.status().borrow().reserved[0];
    let (dead, alive) = if first == r1.handle.peer_id() {
        (r1, r2)
    } else {
        (r2, r1)
    };
    let alive_id = alive.handle.peer_id();
    dead.handle.shutdown().await;
    let mut st = n.status();
    tokio::time::timeout(
        DEADLINE,
        st.wait_for(|s| s.ready && s.reserved == vec![alive_id]),
    )
    .await
    .unwrap_or_else(|_| panic!("never re-attached: {:?}", n.status().borrow()))
    .expect("status");
    n.shutdown().await;
    alive.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binaries_run_a_node_and_call_through_its_socket() {
    let cp = start_cp().await;
    let r = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member).await;
    let backend = echo_backend().await;
    let once = one_line_backend().await;
    let (b, _bdir) = spawn_node(&cp, &member, "spawn b", |mut base| {
        base.services.expose = vec![("echo".into(), backend), ("once".into(), once)];
        base
    })
    .await;
    ready(&b, "b").await;

    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = token_file(dir.path(), &member).await;
    let data = dir.path().join("data");
    // A free port for its /metrics (released for the node).
    let metrics_addr =
        std::net::SocketAddr::from(([127, 0, 0, 1], agentmesh_testkit::free_tcp_port()));
    let metrics = metrics_addr.to_string();
    let mut node = run_node(
        &cp,
        &token_file,
        &data,
        &[
            "--metrics-addr",
            &metrics,
            "--stream-inbound-queue-per-protocol",
            "1",
        ],
    );
    let sock = socket_ready(&data).await;

    // `agentmesh-node call echo`: stdin to the service, the answer on stdout.
    call_echo_until_found(&data, "echo", b"hello from stdin\n").await;

    // The answer ends the call: with stdin left open (a pipe never closed),
    // `call` exits once the service has answered and closed its side.
    let mut call = tokio::process::Command::new(NODE_EXE)
        .args(["call", "once", "--data-dir"])
        .arg(&data)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run call");
    let mut open_stdin = call.stdin.take().expect("stdin");
    open_stdin.write_all(b"ping\n").await.expect("stdin");
    let out = tokio::time::timeout(DEADLINE, call.wait_with_output())
        .await
        .expect("call exits with the answer while its stdin is still open")
        .expect("call output");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"got: ping\n");
    drop(open_stdin);

    // The binary's /metrics carries the process-wide gauges: jemalloc's
    // (read at the scrape, so resident bytes are never 0) and the watchdog's.
    let (_, m) = http_get(metrics_addr, "/metrics").await;
    assert!(
        metric(&m, "agentmesh_runtime_allocator_resident_bytes") > 0.0,
        "{m}"
    );
    assert!(m.contains("agentmesh_runtime_stalls_total"), "{m}");
    // The stream drop counter (the flag's metric) is served too, at 0.
    let series = format!(
        "agentmesh_streams_inbound_dropped_total{{protocol=\"{}\",reason=\"queue_full\"}} 0",
        agentmesh_proto::protocols::CALL
    );
    assert!(m.contains(&series), "{series} missing: {m}");

    // SIGTERM: graceful stop, exit status 0, socket removed.
    sigterm(&mut node).await;
    assert!(!sock.exists(), "socket left behind");

    b.shutdown().await;
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_refreshed_and_re_presented_before_they_expire() {
    let cp = start_cp_with(|c| {
        c.credential_ttl_secs = 20;
        c.clock_skew_secs = 0;
    })
    .await;
    let r = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member).await;
    let ((b, _bdir), (a, _adir)) = echo_pair(
        &cp,
        &member,
        |mut base| {
            base.control_plane.credential_skew = Duration::ZERO;
            base
        },
        |base| base,
    )
    .await;
    let first = a.status().borrow().credential_expires_at_unix_secs;
    assert!(first > 0);

    // Both refresh well before expiry (two thirds into the lifetime).
    for n in [&a, &b] {
        let mut st = n.status();
        tokio::time::timeout(
            DEADLINE,
            st.wait_for(|s| s.credential_expires_at_unix_secs > first),
        )
        .await
        .expect("refreshed in time")
        .expect("status");
    }
    // Past the first credential's expiry, both are still admitted and calls work.
    eventually("the first credential's expiry", || async {
        (agentmesh_proto::unix_now() > first + 1).then_some(())
    })
    .await;
    ready(&a, "a after the first expiry").await;
    ready(&b, "b after the first expiry").await;
    let mut s = call_until_found(&a, "echo").await;
    round_trip(&mut s, 4096).await;
    drop(s);
    let (_, m) = http_get(a.metrics_addr().expect("metrics"), "/metrics").await;
    assert!(
        metric(
            &m,
            r#"agentmesh_node_control_plane_total{op="refresh",result="ok"}"#
        ) >= 1.0,
        "{m}"
    );
    assert!(metric(&m, "agentmesh_node_credential_expires_at_seconds") > first as f64);

    a.shutdown().await;
    b.shutdown().await;
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_calls_in_flight_and_withdraws_records() {
    let cp = start_cp().await;
    let r = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member).await;
    let ((b, _bdir), (a, _adir)) = echo_pair(&cp, &member, |base| base, |base| base).await;

    // A call is mid-way when B starts stopping.
    let mut s = call_until_found(&a, "echo").await;
    // The call in flight still completes, byte for byte.
    let stopping = echo_across_a_stop(&mut s, b, "b", b"first half, ", b"second half").await;
    drop(s);
    tokio::time::timeout(DEADLINE, stopping)
        .await
        .expect("b stopped in time")
        .expect("join");

    // B withdrew its record: nobody provides echo any more.
    let end = Instant::now() + DEADLINE;
    loop {
        match a.call("echo").await {
            Err(CallError::NoProviders(_)) => break,
            other => {
                assert!(Instant::now() < end, "record never withdrawn: {other:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    a.shutdown().await;
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_nodes_share_a_process_and_a_registry() {
    let cp = start_cp().await;
    let r = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member).await;
    let mut registry = prometheus_client::registry::Registry::default();
    let mut dirs = Vec::new();
    let mut nodes = Vec::new();
    for i in 0..20 {
        let dir = tempfile::tempdir().expect("tempdir");
        let sub = registry.sub_registry_with_label(("member".into(), i.to_string().into()));
        let n = agentmesh_node::spawn(
            {
                let mut c = node_config(&cp, &member, dir.path());
                c.metrics_addr = None;
                c.local.no_socket = true;
                c
            },
            Some(sub),
        )
        .await
        .expect("spawn");
        nodes.push(n);
        dirs.push(dir);
    }
    for n in &nodes {
        ready(n, "one of many").await;
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    let ready_series = text
        .lines()
        .filter(|l| l.starts_with("agentmesh_node_ready{") && l.ends_with(" 1"))
        .count();
    assert_eq!(ready_series, 20, "{text}");
    // Each node's stream drop counter is on its sub-registry, label values
    // pre-created at 0 for both protocols the node accepts.
    for protocol in [
        agentmesh_proto::protocols::CALL,
        agentmesh_proto::protocols::GOAWAY,
    ] {
        for reason in ["queue_full", "not_accepted"] {
            let labels = format!("protocol=\"{protocol}\",reason=\"{reason}\"");
            let zeros = text
                .lines()
                .filter(|l| {
                    l.starts_with("agentmesh_streams_inbound_dropped_total{")
                        && l.contains(&labels)
                        && l.ends_with(" 0")
                })
                .count();
            assert_eq!(zeros, 20, "{labels}: {text}");
        }
    }
    for n in nodes {
        n.shutdown().await;
    }
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transit_connection_closes_once_idle() {
    let cp = start_cp().await;
    let r1 = start_router(&cp, "r1").await;
    let r2 = start_router(&cp, "r2").await;
    let member = cp.token(Role::Member).await;
    let ((b, _bdir), (a, _adir)) = echo_pair(
        &cp,
        &member,
        |mut base| {
            base.routers.selector = selector("r2");
            base
        },
        |mut base| {
            base.routers.selector = selector("r1");
            base.connections.idle = Duration::from_secs(1);
            base
        },
    )
    .await;
    let transit = |r: &Router| {
        metric(
            &r.handle.metrics_text(),
            "agentmesh_router_transit_connections",
        )
    };
    let mut s = call_until_found(&a, "echo").await;
    assert!(s.route().transit);
    eventually("the router to count the transit connection", || async {
        (transit(&r2) == 1.0).then_some(())
    })
    .await;
    round_trip(&mut s, 1024).await;
    drop(s);
    // Nothing uses it any more: it closes (and the router forgets it).
    eventually("the transit connection to close", || async {
        (transit(&r2) == 0.0).then_some(())
    })
    .await;
    // A stays attached to its own router throughout.
    assert!(a.status().borrow().ready);
    a.shutdown().await;
    b.shutdown().await;
    r1.handle.shutdown().await;
    r2.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_connection_finishes_while_its_node_stops() {
    let cp = start_cp().await;
    let r = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member).await;
    let ((b, _bdir), (a, _adir)) = echo_pair(
        &cp,
        &member,
        |base| base,
        |mut base| {
            base.local.forward = vec![("127.0.0.1:0".parse().expect("addr"), "echo".into())];
            base
        },
    )
    .await;
    // Make sure the provider is findable before relying on the forward.
    drop(call_until_found(&a, "echo").await);

    let mut t = tokio::net::TcpStream::connect(a.forward_addrs()[0])
        .await
        .expect("forward");
    let stopping = echo_across_a_stop(&mut t, a, "a", b"before stop, ", b"after stop").await;
    tokio::time::timeout(DEADLINE, stopping)
        .await
        .expect("a stopped in time")
        .expect("join");
    b.shutdown().await;
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_listeners_share_one_connection_bound_and_count_the_waits() {
    let cp = start_cp().await;
    let r = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member).await;
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let ((b, _bdir), (a, _adir)) = echo_pair(
        &cp,
        &member,
        |base| base,
        |mut base| {
            base.local.forward = vec![(any, "echo".into()), (any, "echo".into())];
            base.local.max_forward_connections = 1;
            base
        },
    )
    .await;
    drop(call_until_found(&a, "echo").await);
    let metrics_addr = a.metrics_addr().expect("metrics");
    let series = |name: &str| format!(r#"agentmesh_node_{name}{{listener="forward"}}"#);
    let read = |name: String| async move {
        let (_, m) = http_get(metrics_addr, "/metrics").await;
        metric(&m, &name)
    };

    // The first listener's connection holds the one slot.
    let mut first = tokio::net::TcpStream::connect(a.forward_addrs()[0])
        .await
        .expect("forward 1");
    first.write_all(b"one").await.expect("write");
    let mut got = [0u8; 3];
    tokio::time::timeout(DEADLINE, first.read_exact(&mut got))
        .await
        .expect("echo in time")
        .expect("read");
    assert_eq!(&got, b"one");
    assert_eq!(read(series("local_connections_active")).await, 1.0);

    // The second listener's connection waits for it, counted.
    let mut second = tokio::net::TcpStream::connect(a.forward_addrs()[1])
        .await
        .expect("forward 2");
    second.write_all(b"two").await.expect("write");
    eventually("the second listener to wait", || async {
        (read(series("local_connection_waits_total")).await >= 1.0).then_some(())
    })
    .await;
    assert_eq!(read(series("local_connections_active")).await, 1.0);

    // Once the first ends, the second is served.
    drop(first);
    let mut got = [0u8; 3];
    tokio::time::timeout(DEADLINE, second.read_exact(&mut got))
        .await
        .expect("served once the slot is free")
        .expect("read");
    assert_eq!(&got, b"two");
    drop(second);
    eventually("the slot to be freed", || async {
        (read(series("local_connections_active")).await == 0.0).then_some(())
    })
    .await;
    assert_eq!(read(series("local_connection_waits_total")).await, 1.0);
    assert_eq!(read(series("accept_errors_total")).await, 0.0);

    a.shutdown().await;
    b.shutdown().await;
    r.handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_away_makes_before_it_breaks() {
    let cp = start_cp().await;
    let routers = [
        start_router(&cp, "r1").await,
        start_router(&cp, "r2").await,
        start_router(&cp, "r3").await,
    ];
    let member = cp.token(Role::Member).await;
    let backend = echo_backend().await;
    let (n, _dir) = spawn_node(&cp, &member, "spawn", |mut base| {
        base.routers.count = 2;
        base.services.expose = vec![("echo".into(), backend)];
        base
    })
    .await;
    let mut st = n.status();
    tokio::time::timeout(DEADLINE, st.wait_for(|s| s.ready && s.reserved.len() == 2))
        .await
        .expect("on two routers in time")
        .expect("status");
    let before = n.status().borrow().reserved.clone();
    let drained = routers
        .iter()
        .find(|r| before.contains(&r.handle.peer_id()))
        .expect("one of ours");
    let gone = drained.handle.peer_id();

    // Watch every change from here: never below one reserved router, never unready.
    let mut watch = n.status();
    let watcher = tokio::spawn(async move {
        let mut worst = usize::MAX;
        let mut always_ready = true;
        loop {
            {
                let s = watch.borrow_and_update();
                worst = worst.min(s.reserved.len());
                always_ready &= s.ready;
                if s.reserved.len() == 2 && !s.reserved.contains(&gone) {
                    return (worst, always_ready);
                }
            }
            if watch.changed().await.is_err() {
                return (worst, always_ready);
            }
        }
    });
    drained.handle.drain();
    let (worst, always_ready) = tokio::time::timeout(DEADLINE, watcher)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "never moved off the drained router: {:?}",
                n.status().borrow()
            )
        })
        .expect("watcher");
    assert!(
        worst >= 1,
        "fell to {worst} reserved routers during the move"
    );
    assert!(always_ready, "became unready during the move");
    let (_, m) = http_get(n.metrics_addr().expect("metrics"), "/metrics").await;
    assert_eq!(
        metric(&m, r#"agentmesh_node_goaways_total{result="draining"}"#),
        1.0,
        "{m}"
    );
    n.shutdown().await;
    for r in routers {
        r.handle.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_services_show_what_a_running_node_holds() {
    let cp = start_cp().await;
    let r = start_router(&cp, "r1").await;
    let member = cp.token(Role::Member).await;
    let backend = echo_backend().await;
    let (b, _bdir) = spawn_node(&cp, &member, "spawn b", |mut base| {
        base.services.expose = vec![("echo".into(), backend)];
        base
    })
    .await;
    ready(&b, "b").await;

    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = token_file(dir.path(), &member).await;
    let data = dir.path().join("data");
    // Nothing runs there yet: one clear line, a failing exit status.
    assert_no_node(&["status"], &data).await;
    assert_no_node(&["services", "--json"], &data).await;

    let local = echo_backend().await;
    let expose = format!("local={local}");
    let mut node = run_node(
        &cp,
        &token_file,
        &data,
        &["--expose", &expose, "--forward", "127.0.0.1:0=echo"],
    );
    socket_ready(&data).await;
    // One call, so the node has looked `echo` up and counted a call.
    call_echo_until_found(&data, "echo", b"hi\n").await;

    let router = r.handle.peer_id().to_string();
    let (ok, text, err) = node_cli(&["status"], &data).await;
    assert!(ok, "{err}");
    assert!(
        text.contains("readiness   ready: 1 of 1 routers reserved"),
        "{text}"
    );
    assert!(
        text.contains(&format!("  {router}  reserved at ")),
        "{text}"
    );
    assert!(text.contains("records accepted"), "{text}");
    assert!(text.contains("credential  expires at "), "{text}");
    assert!(
        text.contains(&format!("exposed     local -> {local}")),
        "{text}"
    );
    assert!(text.contains("forwarded   127.0.0.1:"), "{text}");
    assert!(text.contains("outbound 1 ok, "), "{text}");

    let (ok, json, err) = node_cli(&["status", "--json"], &data).await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("status JSON");
    assert_eq!(v["ready"], true, "{json}");
    assert_eq!(v["routers"][0]["peer_id"], router.as_str(), "{json}");
    assert_eq!(v["routers"][0]["state"], "reserved", "{json}");
    assert_eq!(v["recent_calls"]["outbound_ok"], 1, "{json}");
    assert!(
        v["credential_expires_in_secs"]
            .as_i64()
            .is_some_and(|s| s > 0),
        "{json}"
    );

    let (ok, text, err) = node_cli(&["services"], &data).await;
    assert!(ok, "{err}");
    assert!(
        text.contains(&format!("local  exposed here (backend {local})")),
        "{text}"
    );
    assert!(text.contains("echo  forwarded from 127.0.0.1:"), "{text}");
    assert!(text.contains("echo  1 provider(s), looked up "), "{text}");
    let (ok, json, err) = node_cli(&["services", "--json"], &data).await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("services JSON");
    assert_eq!(v["seen"][0]["name"], "echo", "{json}");
    assert_eq!(v["seen"][0]["providers"], 1, "{json}");

    // Stopped: no node at that data dir any more.
    sigterm(&mut node).await;
    assert_no_node(&["status", "--json"], &data).await;

    b.shutdown().await;
    r.handle.shutdown().await;
}
