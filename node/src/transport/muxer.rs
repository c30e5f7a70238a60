//! The member's yamux: a libp2p `StreamMuxer` over the `yamux` crate with a
//! bounded connection receive window, in place of libp2p-yamux, whose
//! window is fixed at 1 GiB per connection (its `Config` cannot change it).
//!
//! Why: the receive window is what a peer may make us buffer on one
//! connection before it must wait for us to read. A member holds a
//! connection to each of its K routers and one per relayed peer; with
//! 1 GiB each, a lying peer (or a slow local reader) could make one member
//! hold gigabytes. yamux guarantees each stream 256 KiB and lets fast
//! streams grow into what is left of the connection window, so the window
//! is `max_streams × 256 KiB` plus the room one fast stream may grow into.
//!
//! Inbound streams the swarm has not taken yet are buffered up to
//! [`MAX_BUFFERED_INBOUND_STREAMS`] (libp2p-yamux's bound); past it a stream
//! is dropped (the remote sees a reset) and counted.

use agentmesh_streams::yamux::InboundBuffer;
pub(crate) use agentmesh_streams::yamux::YamuxUpgrade;
use prometheus_client::metrics::counter::Counter;

/// The window yamux guarantees every stream, bytes (its `DEFAULT_CREDIT`).
pub(crate) const STREAM_CREDIT_BYTES: u64 = 256 * 1024;
/// Inbound streams buffered while the swarm is not asking for them.
pub(crate) const MAX_BUFFERED_INBOUND_STREAMS: usize = 256;

/// The bounds of every yamux connection of a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowLimits {
    /// Streams open at once on one connection (yamux refuses more).
    pub(crate) max_streams: usize,
    /// Receive window of one connection, all its streams together, bytes.
    pub(crate) connection_window_bytes: u64,
}

/// Why limits cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum LimitsError {
    /// yamux needs 256 KiB per stream.
    #[error(
        "--yamux-connection-window-kib {window_kib} is below --yamux-max-streams {streams} × 256 KiB = {need_kib} KiB"
    )]
    WindowTooSmall {
        /// The window asked for, KiB.
        window_kib: u64,
        /// The streams asked for.
        streams: usize,
        /// The least window they need, KiB.
        need_kib: u64,
    },
    /// At least one stream.
    #[error("--yamux-max-streams must be at least 1")]
    NoStreams,
}

impl WindowLimits {
    /// Checks what yamux would otherwise assert (and panic on).
    pub(crate) fn check(&self) -> Result<(), LimitsError> {
        if self.max_streams == 0 {
            return Err(LimitsError::NoStreams);
        }
        let need = (self.max_streams as u64).saturating_mul(STREAM_CREDIT_BYTES);
        if self.connection_window_bytes < need {
            return Err(LimitsError::WindowTooSmall {
                window_kib: self.connection_window_bytes / 1024,
                streams: self.max_streams,
                need_kib: need / 1024,
            });
        }
        Ok(())
    }

    fn config(&self) -> yamux::Config {
        let mut c = yamux::Config::default();
        // Order matters: yamux asserts window >= streams × 256 KiB on each
        // call, so lift the window, set the streams, then bound the window.
        c.set_max_connection_receive_window(None);
        c.set_max_num_streams(self.max_streams);
        c.set_max_connection_receive_window(Some(
            usize::try_from(self.connection_window_bytes).unwrap_or(usize::MAX),
        ));
        c
    }
}

/// The yamux upgrade with `limits` (checked first: see
/// [`WindowLimits::check`]); `dropped` counts inbound streams dropped past
/// the buffer.
pub(crate) fn yamux_upgrade(
    limits: WindowLimits,
    dropped: Counter,
) -> Result<YamuxUpgrade, LimitsError> {
    limits.check()?;
    Ok(YamuxUpgrade::new(
        limits.config(),
        InboundBuffer {
            max: MAX_BUFFERED_INBOUND_STREAMS,
            dropped,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentmesh_streams::yamux::YAMUX_PROTOCOL;
    use futures::future;
    use futures::{AsyncReadExt as _, AsyncWriteExt as _};
    use libp2p::core::muxing::StreamMuxerExt as _;
    use libp2p::core::upgrade::InboundConnectionUpgrade as _;
    use tokio_util::compat::TokioAsyncReadCompatExt as _;

    #[test]
    fn limits_yamux_would_panic_on_are_refused() {
        let ok = WindowLimits {
            max_streams: 4,
            connection_window_bytes: 4 * STREAM_CREDIT_BYTES,
        };
        assert_eq!(ok.check(), Ok(()));
        let small = WindowLimits {
            connection_window_bytes: 4 * STREAM_CREDIT_BYTES - 1,
            ..ok
        };
        assert!(matches!(
            small.check(),
            Err(LimitsError::WindowTooSmall { need_kib: 1024, .. })
        ));
        let none = WindowLimits {
            max_streams: 0,
            ..ok
        };
        assert_eq!(none.check(), Err(LimitsError::NoStreams));
        assert!(yamux_upgrade(small, Counter::default()).is_err());
    }

    /// A peer keeps writing while the member reads fast for a while (so
    /// yamux's auto-tuning grows the stream's window as far as it may) and
    /// then stops reading: what the peer could still push into the member
    /// is bounded by the window (256 KiB guaranteed plus the room above
    /// `max_streams` × 256 KiB), not libp2p-yamux's 1 GiB. Over an
    /// in-memory pipe, the member's upgrade on one end and a stock yamux on
    /// the other (as a lying peer would run), in paused time: the writer's
    /// pause elapses only once every task is idle, that is once its write
    /// is blocked by the window, so "blocked" is exact, not a guess.
    #[tokio::test(start_paused = true)]
    async fn a_flooding_peer_is_held_to_the_window() {
        const CHUNK: usize = 16 * 1024;
        const READ_FIRST: usize = 8 * 1024 * 1024;
        let extra = STREAM_CREDIT_BYTES;
        let limits = WindowLimits {
            max_streams: 4,
            connection_window_bytes: 4 * STREAM_CREDIT_BYTES + extra,
        };
        let (dialed, accepted) = tokio::io::duplex(64 * 1024);
        let upgrade = yamux_upgrade(limits, Counter::default()).expect("limits");
        let mut member = upgrade
            .upgrade_inbound(accepted.compat(), YAMUX_PROTOCOL)
            .await
            .expect("member side");
        let mut flooder = yamux::Connection::new(
            dialed.compat(),
            yamux::Config::default(),
            yamux::Mode::Client,
        );
        let flood = tokio::spawn(async move {
            let mut out = future::poll_fn(|cx| flooder.poll_new_outbound(cx))
                .await
                .expect("open");
            let chunk = vec![7u8; CHUNK];
            let mut sent = 0u64;
            let driver = future::poll_fn(|cx| flooder.poll_next_inbound(cx).map(|_| ()));
            tokio::pin!(driver);
            loop {
                tokio::select! {
                    r = out.write_all(&chunk) => { r.expect("write"); sent += CHUNK as u64; }
                    _ = &mut driver => break,
                    // Only once the member has all it reads first can a
                    // blocked write mean "window full".
                    _ = tokio::time::sleep(std::time::Duration::from_millis(500)),
                        if sent >= READ_FIRST as u64 => break,
                }
            }
            sent
        });
        let mut stream = future::poll_fn(|cx| member.poll_inbound_unpin(cx))
            .await
            .expect("inbound stream");
        let keep = tokio::spawn(async move {
            let _ = future::poll_fn(|cx| member.poll_unpin(cx)).await;
        });
        let mut first = vec![0u8; READ_FIRST];
        stream.read_exact(&mut first).await.expect("read first");
        let sent = flood.await.expect("flood");
        let unread = sent - READ_FIRST as u64;
        assert!(
            unread <= STREAM_CREDIT_BYTES + extra + CHUNK as u64,
            "the peer pushed {unread} unread bytes past a {} byte bound",
            STREAM_CREDIT_BYTES + extra
        );
        // What was sent arrives intact once the member reads again.
        let mut rest = vec![0u8; usize::try_from(unread).expect("fits")];
        stream.read_exact(&mut rest).await.expect("read rest");
        assert!(first.iter().chain(&rest).all(|b| *b == 7));
        keep.abort();
    }
}
