//! Connections accepted on the listening port, held back from the swarm
//! for a moment so that a dial from that port to their source can take
//! them over ([`Held::claim`]): see "A punch that lands on the listening
//! port" in the parent module.
//!
//! A held connection goes to the swarm (as an inbound connection) as soon
//! as its remote sends a byte (a dialer speaks first: it is not a punch in
//! the listener's role), or after [`HOLD`]; a dial that takes it first
//! gets it instead and the swarm's upgrade of it fails. Bounded by what
//! is accepted and not yet upgraded (the listener's handshake table,
//! `transport/handshakes.rs`, which drops the upgrade of a connection it
//! refuses or sheds): an entry leaves the registry when its upgrade
//! future ends or is dropped.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot};

/// How long a silent accepted connection waits for a dial to take it.
pub(super) const HOLD: Duration = Duration::from_secs(1);

/// A dial's request for a held connection: where to send it.
type Claim = oneshot::Sender<TcpStream>;

/// The registry of held connections by source address (cheap to clone).
#[derive(Clone, Default)]
pub(super) struct Held(Arc<Inner>);

#[derive(Default)]
struct Inner {
    /// Held connections by source: an id (a newer one from the same
    /// source replaces an older) and where to ask for it.
    by_source: Mutex<HashMap<SocketAddr, (u64, oneshot::Sender<Claim>)>>,
    /// Woken whenever a connection is held.
    arrived: Notify,
    next: AtomicU64,
}

/// Removes a held connection's entry when its future ends, unless a newer
/// one from the same source replaced it.
struct Entry {
    held: Held,
    from: SocketAddr,
    id: u64,
}

impl Drop for Entry {
    fn drop(&mut self) {
        let mut m = self.held.0.by_source.lock();
        if m.get(&self.from).is_some_and(|(id, _)| *id == self.id) {
            m.remove(&self.from);
        }
    }
}

/// The error of an inbound connection a dial took over.
const TAKEN: &str = "taken over by a dial from the listening port to its source";

impl Held {
    /// Holds `stream`, accepted from `from`: the returned future yields it
    /// for the swarm to upgrade as inbound once `from` sends a byte or
    /// after `hold`, or fails if a dial took it first.
    pub(super) fn hold(
        &self,
        from: SocketAddr,
        stream: TcpStream,
        hold: Duration,
    ) -> impl Future<Output = io::Result<TcpStream>> + Send + 'static {
        let (claims, mut claimed) = oneshot::channel::<Claim>();
        let id = self.0.next.fetch_add(1, Ordering::Relaxed);
        self.0.by_source.lock().insert(from, (id, claims));
        self.0.arrived.notify_waiters();
        let entry = Entry {
            held: self.clone(),
            from,
            id,
        };
        async move {
            let _entry = entry;
            let mut first = [0u8; 1];
            let claim = tokio::select! {
                c = &mut claimed => c.ok(),
                // The remote spoke first (or closed): an ordinary inbound
                // connection. (`peek`, not `readable`: a fresh socket's
                // readiness may be a false positive.)
                _ = stream.peek(&mut first) => None,
                _ = tokio::time::sleep(hold) => None,
            };
            match claim {
                Some(to_dial) => match to_dial.send(stream) {
                    Ok(()) => Err(io::Error::other(TAKEN)),
                    // The dial gave up meanwhile: ours after all.
                    Err(stream) => Ok(stream),
                },
                None => Ok(stream),
            }
        }
    }

    /// The connection held from `to`, waiting up to `wait` for one to be
    /// accepted (its handshake may still be under way when the dial finds
    /// the tuple taken). `None`: none came, or it went to the swarm.
    pub(super) async fn claim(&self, to: SocketAddr, wait: Duration) -> Option<TcpStream> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let arrived = self.0.arrived.notified();
            tokio::pin!(arrived);
            // Registered before looking, so a connection held in between
            // still wakes us.
            arrived.as_mut().enable();
            let found = self.0.by_source.lock().remove(&to);
            if let Some((_, claims)) = found {
                let (give, got) = oneshot::channel();
                claims.send(give).ok()?;
                return got.await.ok();
            }
            tokio::time::timeout_at(deadline, arrived).await.ok()?;
        }
    }
}
