//! Uplinks going down and up, and programs inside hosts.

use std::net::SocketAddr;
use std::time::Duration;

use agentmesh_netns::{NatKind, testbed_or_skip};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_uplink_is_down_is_cut_off_silently_until_it_returns() {
    let Some(tb) = testbed_or_skip("uplink_down").await else {
        return;
    };
    let a = tb.public_host("a").await.expect("a");
    let b = tb.public_host("b").await.expect("b");
    let l = b
        .bind_tcp(SocketAddr::new(b.addr().into(), 0))
        .await
        .expect("bind");
    let mut c = a
        .connect(l.local_addr().expect("addr"))
        .await
        .expect("connect");
    let (mut s, _) = l.accept().await.expect("accept");
    let (ua, ub) = (udp_on(&a).await, udp_on(&b).await);
    deliver(&ua, ub.local_addr().expect("addr"), &ub, b"up").await;

    a.set_uplink(false).await.expect("down");
    ua.send_to(b"down", ub.local_addr().expect("addr"))
        .await
        .expect("a sends without an error");
    assert_silent(&ub, b"down", "a datagram crossed a link that is down").await;
    // A write on the open connection fails nowhere: it waits in the socket.
    c.write_all(b"held").await.expect("write while down");
    let mut buf = [0u8; 4];
    assert!(
        tokio::time::timeout(SILENCE, s.read_exact(&mut buf))
            .await
            .is_err(),
        "bytes crossed a link that is down"
    );

    a.set_uplink(true).await.expect("up");
    // The connection lived through it: TCP retransmits once the link is back.
    tokio::time::timeout(DEADLINE, s.read_exact(&mut buf))
        .await
        .expect("retransmitted after the link returned")
        .expect("read");
    assert_eq!(&buf, b"held");
    deliver(&ua, ub.local_addr().expect("addr"), &ub, b"up again").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nat_whose_wan_is_down_cuts_off_every_host_behind_it() {
    let Some(tb) = testbed_or_skip("nat_wan_down").await else {
        return;
    };
    let nat = tb
        .nat("gw", NatKind::EndpointIndependent)
        .await
        .expect("nat");
    let x = tb.host_behind(&nat, "x").await.expect("x");
    let y = tb.host_behind(&nat, "y").await.expect("y");
    let p = tb.public_host("p").await.expect("p");
    let (sx, sy, sp) = (udp_on(&x).await, udp_on(&y).await, udp_on(&p).await);
    let to = sp.local_addr().expect("addr");
    deliver(&sx, to, &sp, b"x up").await;
    deliver(&sy, to, &sp, b"y up").await;
    nat.set_wan(false).await.expect("down");
    sx.send_to(b"x down", to).await.expect("send");
    sy.send_to(b"y down", to).await.expect("send");
    assert_silent(&sp, b"x down", "x got out with the WAN down").await;
    assert_silent(&sp, b"y down", "y got out with the WAN down").await;
    // The LAN itself still works.
    deliver(&sx, sy.local_addr().expect("addr"), &sy, b"lan").await;
    nat.set_wan(true).await.expect("up");
    deliver(&sx, to, &sp, b"x back").await;
    deliver(&sy, to, &sp, b"y back").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_runs_inside_its_host_and_its_log_is_collected() {
    let Some(tb) = testbed_or_skip("program_inside").await else {
        return;
    };
    let h = tb.public_host("h").await.expect("h");
    let mut p = h
        .program("addrs", "ip")
        .args(["-o", "-4", "addr", "show"])
        .spawn()
        .await
        .expect("spawn");
    let status = p.wait(DEADLINE).await.expect("exits");
    assert!(status.success(), "{}", p.log());
    let log = p.log();
    assert!(log.contains(&format!("inet {}/16", h.addr())), "{log}");
    assert_eq!(log.lines().count(), 2, "lo and the uplink only: {log}");
    assert!(p.log_path().starts_with(tb.logs_dir()));

    // A long-running one: its log is read while it runs, and it stops on SIGTERM.
    let mut s = h
        .program("sleeper", "sh")
        .args([
            "-c",
            "echo started in $(ip -o -4 addr show scope global | wc -l) address; exec sleep 600",
        ])
        .spawn()
        .await
        .expect("spawn");
    let line = s
        .wait_for_log("the start line", DEADLINE, |l| {
            l.contains("started").then(|| l.to_string())
        })
        .await
        .expect("logged");
    assert_eq!(line, "started in 1 address");
    let st = s.stop(Duration::from_secs(10)).await.expect("stop");
    assert!(!st.success(), "killed by a signal: {st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_endpoints_inside_a_host_are_read_from_the_test() {
    let Some(tb) = testbed_or_skip("http_inside").await else {
        return;
    };
    let h = tb.public_host("h").await.expect("h");
    // A server on the host's loopback: only reachable from inside it.
    let l = h
        .bind_tcp("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nready",
                )
                .await;
        }
    });
    let r = h.http_get(addr, "/readyz", DEADLINE).await.expect("get");
    assert_eq!((r.status, r.body.as_str()), (200, "ready"));
    // The same address from the machine's own namespace is another socket
    // space: nothing of the host's listens there (a fresh loopback port).
    let other = tb.public_host("other").await.expect("other");
    assert!(other.http_get(addr, "/readyz", DEADLINE).await.is_err());
}
