//! A member that leaves while its credential is being verified is not
//! admitted: a ghost admission would count against the watermark, the
//! lease load and the drain until its credential expired.
//!
//! The race is forced: the router's key fetch (an unknown signing key)
//! goes through a TCP proxy the test holds, the member disconnects while
//! it is held, and the proxy lets it through once the router has seen the
//! member go. Real control plane, real router, real libp2p peer.

use crate::support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentmesh_proto::pb::mesh::Purpose;
use agentmesh_proto::unix_now;
use support::{TestPeer, TestRouter, eventually};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

/// A TCP proxy in front of the control plane whose upstream direction can
/// be held: bytes sent while held are counted and forwarded on release.
struct Gate {
    hold: watch::Sender<bool>,
    held_bytes: Arc<AtomicUsize>,
}

impl Gate {
    /// Starts accepting on `listener`, forwarding to the address `target`
    /// delivers (the control plane binds after the proxy: it must know the
    /// proxy's URL, which clients sign).
    fn start(listener: TcpListener, target: oneshot::Receiver<SocketAddr>) -> Self {
        let (hold, hold_rx) = watch::channel(false);
        let held_bytes = Arc::new(AtomicUsize::new(0));
        let held = held_bytes.clone();
        tokio::spawn(async move {
            let target = target.await.expect("control plane address");
            while let Ok((down, _)) = listener.accept().await {
                let Ok(up) = TcpStream::connect(target).await else {
                    continue;
                };
                let (mut down_r, mut down_w) = down.into_split();
                let (mut up_r, mut up_w) = up.into_split();
                let (mut hold_rx, held) = (hold_rx.clone(), held.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match down_r.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if *hold_rx.borrow() {
                            held.fetch_add(n, Ordering::SeqCst);
                            if hold_rx.wait_for(|h| !*h).await.is_err() {
                                break;
                            }
                        }
                        if up_w.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut up_r, &mut down_w).await;
                });
            }
        });
        Self { hold, held_bytes }
    }

    fn hold(&self, on: bool) {
        self.hold.send_replace(on);
    }

    fn held_bytes(&self) -> usize {
        self.held_bytes.load(Ordering::SeqCst)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_gone_during_a_key_fetch_is_not_admitted() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let proxy_url = format!("http://{}", listener.local_addr().expect("addr"));
    let (target_tx, target_rx) = oneshot::channel();
    let gate = Gate::start(listener, target_rx);
    // New keys sign at once; everyone (router and test) reaches the
    // control plane through the proxy.
    let cp = support::cp::start_cp_with(|c| {
        c.credential_ttl_secs = 3600;
        c.key_grace_secs = 7200;
        c.key_publish_ahead_secs = 0;
        c.key_check_interval_secs = 1;
        c.public_url = Some(proxy_url.clone());
    })
    .await;
    target_tx.send(cp.handle.grpc_addr()).expect("proxy waits");
    let started = unix_now();
    // Keys are synced at start only (the next sync is an hour away), and
    // every wait on the control plane outlasts the test's hold.
    let r = TestRouter::start(&cp, &[], |c| {
        c.metrics_addr = Some("127.0.0.1:0".parse().expect("addr"));
        c.control_plane.lease_interval = Duration::from_secs(3600);
        c.auth.deadline = Duration::from_secs(120);
        c.connections.stream_timeout = Duration::from_secs(120);
        c.control_plane.rpc_timeout = Duration::from_secs(120);
        c.control_plane.retry_budget = Duration::from_secs(120);
        // The new key must come by the fetch under test, not by the watch.
        c.policy.watch = false;
    })
    .await;
    let fetched = eventually("start-up key sync", || async {
        let n = r.metric("agentmesh_router_key_fetch_total{result=\"ok\"}");
        (n >= 1.0).then_some(n)
    })
    .await;
    // A credential signed by a key the router does not hold yet.
    let mut member = TestPeer::new();
    let cred = cp.credential_from_a_new_key(&member.key, started).await;
    member.connect(r.id(), r.addr.clone()).await;
    eventually("the router counts the member's connection", || async {
        (r.metric("agentmesh_router_table_entries{table=\"connections\"}") == 1.0).then_some(())
    })
    .await;

    // The member authenticates; the router fetches keys and is held.
    gate.hold(true);
    let rid = r.id();
    let auth = tokio::spawn(async move { member.auth(rid, Some(cred), Purpose::Attach).await });
    eventually("the router's key fetch is held", || async {
        (gate.held_bytes() > 0).then_some(())
    })
    .await;
    // The member leaves (its swarm is dropped with the task) and the
    // router sees it go.
    auth.abort();
    let _ = auth.await;
    eventually("the router saw the member leave", || async {
        (r.metric("agentmesh_router_table_entries{table=\"connections\"}") == 0.0).then_some(())
    })
    .await;
    gate.hold(false);

    // The credential verifies now, but nobody is there to admit.
    eventually("the verification finished", || async {
        (r.metric("agentmesh_router_key_fetch_total{result=\"ok\"}") > fetched).then_some(())
    })
    .await;
    let refused_or_swept = || {
        r.metric("agentmesh_router_auth_total{purpose=\"attach\",result=\"disconnected\"}")
            + r.metric("agentmesh_router_connections_closed_total{reason=\"disconnected\"}")
    };
    eventually("the ghost refused or swept", || async {
        (refused_or_swept() >= 1.0).then_some(())
    })
    .await;
    eventually("no member is counted", || async {
        (r.metric("agentmesh_router_attached_members") == 0.0
            && r.metric("agentmesh_router_table_entries{table=\"admission\"}") == 0.0)
            .then_some(())
    })
    .await;
    assert_eq!(refused_or_swept(), 1.0, "one ghost, counted once");
    r.handle.shutdown().await;
}
