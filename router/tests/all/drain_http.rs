//! `POST /drain` on the metrics listener over real sockets: refused (403,
//! counted) from an address that is not loopback, accepted from loopback,
//! and from anywhere with `drain_http_allow_remote`. The router runs without
//! a control plane (nothing here needs one; its drain skips the lease).
//!
//! A connection from a non-loopback address needs one on this machine: the
//! address the kernel would send from towards a public destination (no
//! packet is sent). Without one the remote half is skipped, loudly; the
//! decision itself is unit-tested in `src/http.rs`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use agentmesh_router::{Config, RouterHandle};
use agentmesh_testkit::{DEADLINE, metric};

const REFUSED: &str =
    r#"agentmesh_router_http_requests_refused_total{endpoint="drain",reason="not_loopback"}"#;

/// A local address that is not loopback, if this machine has one.
fn non_loopback_ip() -> Option<IpAddr> {
    // Documentation ranges: routed like any destination, never answered.
    for (bind, to) in [
        ("0.0.0.0:0", "198.51.100.1:9"),
        ("[::]:0", "[2001:db8::1]:9"),
    ] {
        let Ok(s) = std::net::UdpSocket::bind(bind) else {
            continue;
        };
        if s.connect(to).is_err() {
            continue;
        }
        if let Ok(local) = s.local_addr() {
            let ip = local.ip().to_canonical();
            if !ip.is_loopback() && !ip.is_unspecified() {
                return Some(ip);
            }
        }
    }
    None
}

/// A router with its metrics listener on every address of `ip`'s family.
async fn start(ip: IpAddr, dir: &std::path::Path, allow_remote: bool) -> RouterHandle {
    let any = match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    agentmesh_router::spawn(Config {
        key_path: dir.join("router.key"),
        listen: vec!["/ip4/127.0.0.1/tcp/0".parse().expect("addr")],
        metrics_addr: Some(SocketAddr::new(any, 0)),
        control_plane: agentmesh_router::config::ControlPlaneConfig {
            // Nothing listens here: enrollment retries in the background.
            url: "http://127.0.0.1:9".into(),
            // Short, so shutdown does not wait out an enrollment attempt.
            retry_budget: Duration::from_secs(1),
            rpc_timeout: Duration::from_secs(1),
            ..Default::default()
        },
        drain: agentmesh_router::config::DrainConfig {
            grace: Duration::from_secs(4),
            http_allow_remote: allow_remote,
            ..Default::default()
        },
        ..Default::default()
    })
    .await
    .expect("spawn router")
}

/// `POST /drain` to `ip` on the router's metrics port: (status, response).
async fn post_drain(router: &RouterHandle, ip: IpAddr) -> (u16, String) {
    let port = router.metrics_addr().expect("metrics listener").port();
    agentmesh_testkit::http_post(SocketAddr::new(ip, port), "/drain").await
}

async fn wait_drained(router: &RouterHandle) {
    let mut done = router.drained();
    tokio::time::timeout(DEADLINE, done.wait_for(|d| *d))
        .await
        .expect("drain finished in time")
        .expect("drained channel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_over_http_is_refused_from_a_remote_address_and_accepted_from_loopback() {
    let Some(ip) = non_loopback_ip() else {
        eprintln!("SKIPPED: no non-loopback address on this machine (unit tests cover the check)");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let router = start(ip, dir.path(), false).await;
    assert_eq!(
        metric(&router.metrics_text(), REFUSED),
        0.0,
        "pre-created at 0"
    );

    let (code, out) = post_drain(&router, ip).await;
    assert_eq!(code, 403, "{out}");
    assert!(out.contains("only from a loopback address"), "{out}");
    assert!(
        out.contains(&ip.to_string()),
        "the answer names the peer: {out}"
    );
    assert_eq!(metric(&router.metrics_text(), REFUSED), 1.0);

    let loopback = match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    };
    let (code, out) = post_drain(&router, loopback).await;
    assert_eq!(code, 202, "{out}");
    wait_drained(&router).await;
    assert_eq!(metric(&router.metrics_text(), REFUSED), 1.0);
    router.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_over_http_from_anywhere_when_remote_is_allowed() {
    let Some(ip) = non_loopback_ip() else {
        eprintln!("SKIPPED: no non-loopback address on this machine (unit tests cover the check)");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let router = start(ip, dir.path(), true).await;
    let (code, out) = post_drain(&router, ip).await;
    assert_eq!(code, 202, "{out}");
    wait_drained(&router).await;
    assert_eq!(metric(&router.metrics_text(), REFUSED), 0.0);
    router.shutdown().await;
}
