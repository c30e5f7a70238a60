//! Inbound handshakes shared fairly by source, shed by progress.
//!
//! A listener holds a bounded number of connections in their handshake
//! (TCP accepted, noise and the muxer not done). Before the handshake a
//! member dialing from an address looks exactly like an attacker flooding
//! from it, so a per-source share alone lets the flood keep the member out:
//! the share is always full of the flood's stalled connections. Here a
//! newcomer at its source's share (or at the global budget) takes the place
//! of the handshake that progressed least (see [`table`](self) rules in
//! `table.rs`), and that handshake is **cancelled**: its socket closes at
//! once. An attacker renewing stalled handshakes keeps shedding its own; a
//! member whose handshake moves completes.
//!
//! - [`Handshakes`]: the table (one per listener process), its budgets,
//!   the program's [`Gate`] (how many handshakes a source may hold now, or
//!   none) and its [`Events`] (what to count).
//! - [`Progress`]: how far one handshake got, counted in turns of the
//!   conversation on its raw socket.
//! - Feature `transport`: the libp2p transport wrappers that do it for a
//!   listener: [`Watch`] around the raw TCP transport (progress on the
//!   socket), [`Guarded`] around the upgraded one (admission at accept,
//!   cancellation, release when the upgrade ends), built together by
//!   [`Handshakes::tcp`]; [`Handshakes::guard`] guards a transport whose
//!   bytes cannot be watched (QUIC: oldest first).

mod progress;
mod table;
#[cfg(feature = "transport")]
mod transport;
#[cfg(feature = "transport")]
mod watched;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

pub use progress::Progress;
pub use table::{Limits, Progressed, RefuseReason, Shed, ShedReason, least_progressed};
#[cfg(feature = "transport")]
pub use transport::{Guarded, HandshakeError, PendingHandshake, Watch};
#[cfg(feature = "transport")]
pub use watched::Watched;

use crate::source::SourceKey;
use table::Table;

/// What the program lets a source hold before the handshake.
pub trait Gate: Send + Sync + 'static {
    /// Handshakes the source of `ip` may hold now (its share, less what
    /// else of it the program counts), or `None` to refuse the connection
    /// outright (the gate counts that refusal itself).
    fn room(&self, ip: IpAddr) -> Option<usize>;
}

/// A gate that lets every source hold `per_source` handshakes.
#[derive(Debug, Clone, Copy)]
pub struct PerSource(pub usize);

impl Gate for PerSource {
    fn room(&self, _ip: IpAddr) -> Option<usize> {
        Some(self.0)
    }
}

/// What the table tells the program to count.
pub trait Events: Send + Sync + 'static {
    /// A handshake gave way to a newcomer.
    fn shed(&self, shed: Shed);
    /// A newcomer was refused.
    fn refused(&self, reason: RefuseReason);
    /// Handshakes in progress now.
    fn in_progress(&self, n: usize);
}

struct Shared {
    table: Mutex<Table>,
    gate: Box<dyn Gate>,
    events: Box<dyn Events>,
    /// Orders the progress of every handshake of this table.
    clock: Arc<AtomicU64>,
}

/// Handshakes in progress, shared fairly by source; cheap to clone (one
/// table).
#[derive(Clone)]
pub struct Handshakes {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Handshakes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.shared.table.lock();
        f.debug_struct("Handshakes")
            .field("in_progress", &t.len())
            .field("capacity", &t.capacity())
            .finish_non_exhaustive()
    }
}

impl Handshakes {
    /// A table with `limits`, asking `gate` for each source's room and
    /// telling `events` what happened.
    pub fn new(limits: Limits, gate: impl Gate, events: impl Events) -> Self {
        Self {
            shared: Arc::new(Shared {
                table: Mutex::new(Table::new(limits)),
                gate: Box::new(gate),
                events: Box::new(events),
                clock: Arc::new(AtomicU64::new(0)),
            }),
        }
    }

    /// The progress of a handshake arriving now (stage 0).
    pub fn arriving(&self) -> Arc<Progress> {
        Arc::new(Progress::new(self.shared.clock.clone()))
    }

    /// Admits a newcomer from `ip` whose progress is `progress`, shedding
    /// the handshake that gives way to it if any (its [`Admission`] sees
    /// [`Admission::shed`]); or refuses it (counted by the gate or as
    /// [`Events::refused`]). Holding the returned admission holds the slot.
    pub fn admit(&self, ip: IpAddr, progress: Arc<Progress>) -> Option<Admission> {
        // The gate reads the program's own state: ask before our lock.
        let room = self.shared.gate.room(ip)?;
        let r = self.shared.table.lock().admit(ip, room, progress.clone());
        match r {
            Ok(a) => {
                if let Some(shed) = a.gave_way {
                    self.shared.events.shed(shed);
                }
                self.report();
                Some(Admission {
                    handshakes: self.clone(),
                    source: a.source,
                    id: a.id,
                    progress,
                    shed: a.shed,
                })
            }
            Err(reason) => {
                self.shared.events.refused(reason);
                None
            }
        }
    }

    /// Handshakes in progress now.
    pub fn in_progress(&self) -> usize {
        self.shared.table.lock().len()
    }

    /// Handshakes the source of `ip` holds now.
    pub fn held_by(&self, ip: IpAddr) -> usize {
        self.shared.table.lock().held_by(ip)
    }

    /// Handshakes the source of `ip` holds now that have started (a byte
    /// received, or waiting unread).
    pub fn started_by(&self, ip: IpAddr) -> usize {
        self.shared.table.lock().started_by(ip)
    }

    /// Sources holding a handshake now.
    pub fn sources(&self) -> usize {
        self.shared.table.lock().sources()
    }

    fn release(&self, source: SourceKey, id: u64) {
        self.shared.table.lock().release(source, id);
        self.report();
    }

    fn report(&self) {
        let n = self.shared.table.lock().len();
        self.shared.events.in_progress(n);
    }
}

/// A handshake's slot; freed when dropped (the handshake ended).
#[derive(Debug)]
pub struct Admission {
    handshakes: Handshakes,
    source: SourceKey,
    id: u64,
    progress: Arc<Progress>,
    shed: CancellationToken,
}

impl Admission {
    /// Whether it gave way to a newcomer: stop the handshake.
    pub fn is_shed(&self) -> bool {
        self.shed.is_cancelled()
    }

    /// Completes once it gave way to a newcomer.
    pub fn shed(&self) -> WaitForCancellationFutureOwned {
        self.shed.clone().cancelled_owned()
    }

    /// The source it counts under.
    pub fn source(&self) -> SourceKey {
        self.source
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.progress.finish();
        if !self.shed.is_cancelled() {
            self.handshakes.release(self.source, self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Counts {
        shed: AtomicUsize,
        refused: AtomicUsize,
        in_progress: AtomicUsize,
    }

    #[derive(Clone, Default)]
    struct Counted(Arc<Counts>);

    impl Events for Counted {
        fn shed(&self, _: Shed) {
            self.0.shed.fetch_add(1, Ordering::Relaxed);
        }
        fn refused(&self, _: RefuseReason) {
            self.0.refused.fetch_add(1, Ordering::Relaxed);
        }
        fn in_progress(&self, n: usize) {
            self.0.in_progress.store(n, Ordering::Relaxed);
        }
    }

    /// Refuses 127.0.0.66, lets others hold 2.
    struct Blocks66;

    impl Gate for Blocks66 {
        fn room(&self, ip: IpAddr) -> Option<usize> {
            (ip != IpAddr::from([127, 0, 0, 66])).then_some(2)
        }
    }

    #[tokio::test]
    async fn admissions_hold_slots_until_dropped_and_the_shed_one_is_told() {
        let c = Counted::default();
        let limits = Limits {
            max_pending: 8,
            ipv6_prefix_len: 64,
        };
        let h = Handshakes::new(limits, Blocks66, c.clone());
        let ip = IpAddr::from([127, 0, 0, 5]);
        assert!(
            h.admit(IpAddr::from([127, 0, 0, 66]), h.arriving())
                .is_none()
        );
        assert_eq!(
            c.0.refused.load(Ordering::Relaxed),
            0,
            "the gate counts its own"
        );
        let first = h.admit(ip, h.arriving()).expect("room");
        let second = h.admit(ip, h.arriving()).expect("room");
        assert_eq!(c.0.in_progress.load(Ordering::Relaxed), 2);
        let third = h.admit(ip, h.arriving()).expect("sheds the first");
        tokio::time::timeout(std::time::Duration::from_secs(5), first.shed())
            .await
            .expect("told");
        assert!(first.is_shed() && !second.is_shed());
        assert_eq!(c.0.shed.load(Ordering::Relaxed), 1);
        drop(first);
        assert_eq!((h.in_progress(), h.held_by(ip)), (2, 2));
        drop((second, third));
        assert_eq!((h.in_progress(), h.sources()), (0, 0));
        assert_eq!(c.0.in_progress.load(Ordering::Relaxed), 0);
    }
}
