//! What the testbed's own tests share.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use agentmesh_netns::Host;
use tokio::net::UdpSocket;

/// Deadline of any wait that expects something to happen.
pub(crate) const DEADLINE: Duration = Duration::from_secs(20);

/// How long a packet that must not arrive is waited for: on a veth in one
/// machine a packet that gets through arrives within milliseconds.
pub(crate) const SILENCE: Duration = Duration::from_millis(800);

/// A UDP socket on `host` at its own address, any port.
pub(crate) async fn udp_on(host: &Host) -> UdpSocket {
    host.bind_udp(SocketAddr::new(host.addr().into(), 0))
        .await
        .expect("bind udp")
}

/// Receives one datagram within `wait`: its payload and source.
pub(crate) async fn recv(s: &UdpSocket, wait: Duration) -> Option<(Vec<u8>, SocketAddr)> {
    let mut buf = vec![0u8; 2048];
    match tokio::time::timeout(wait, s.recv_from(&mut buf)).await {
        Ok(Ok((n, from))) => Some((buf[..n].to_vec(), from)),
        Ok(Err(e)) => panic!("recv: {e}"),
        Err(_) => None,
    }
}

/// Receives the first datagram carrying `payload` within `wait`: its
/// source. Others are skipped: [`deliver`] sends until one arrives, so late
/// copies of an earlier payload may still be queued.
pub(crate) async fn recv_payload(
    s: &UdpSocket,
    payload: &[u8],
    wait: Duration,
) -> Option<SocketAddr> {
    let end = tokio::time::Instant::now() + wait;
    loop {
        let left = end.saturating_duration_since(tokio::time::Instant::now());
        let (got, from) = recv(s, left).await?;
        if got == payload {
            return Some(from);
        }
    }
}

/// Asserts that no datagram carrying `payload` reaches `at` within
/// [`SILENCE`] (others, e.g. late copies from [`deliver`], are ignored).
pub(crate) async fn assert_silent(at: &UdpSocket, payload: &[u8], what: &str) {
    let end = tokio::time::Instant::now() + SILENCE;
    while let Some((got, from)) = recv(
        at,
        end.saturating_duration_since(tokio::time::Instant::now()),
    )
    .await
    {
        assert_ne!(got, payload, "{what}: it arrived from {from}");
    }
}

/// Sends `payload` from `from` to `to` every 200 ms until `at` receives it
/// (ARP and a link coming back take a moment); panics after [`DEADLINE`].
pub(crate) async fn deliver(
    from: &UdpSocket,
    to: SocketAddr,
    at: &UdpSocket,
    payload: &[u8],
) -> SocketAddr {
    let end = tokio::time::Instant::now() + DEADLINE;
    loop {
        from.send_to(payload, to).await.expect("send");
        if let Some((got, src)) = recv(at, Duration::from_millis(200)).await
            && got == payload
        {
            return src;
        }
        assert!(
            tokio::time::Instant::now() < end,
            "{payload:?} never reached {to}"
        );
    }
}
