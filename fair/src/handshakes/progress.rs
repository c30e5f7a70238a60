//! How far one handshake got, as its socket shows it: the **stage** is the
//! number of turns the conversation took (the peer's bytes received, then
//! ours written in answer, then the peer's again, ...), so it measures any
//! handshake without parsing it: noise over multistream-select is
//! "proposal and first message" (1), "our answer" (2), "the third message"
//! (3). With the stage goes the order in which it was reached (a counter
//! shared by a table's handshakes, not a time), which breaks ties: of two
//! handshakes at one stage, the one that reached it first gives way first.
//!
//! One writer (the connection's I/O, through [`super::Watched`]) advances it;
//! the table reads it when it picks who gives way. Once the handshake is
//! over, [`Progress::finish`] stops the writer from advancing it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

/// Whether bytes of the peer wait unread on the socket (see
/// [`Progress::set_probe`]).
pub(crate) type Probe = Box<dyn Fn() -> bool + Send + Sync>;

/// Bits of the packed state that hold the order.
const ORDER_BITS: u32 = 56;
const ORDER_MASK: u64 = (1 << ORDER_BITS) - 1;

/// One handshake's progress: its stage and when (in order) it got there.
pub struct Progress {
    /// `stage << 56 | order`.
    state: AtomicU64,
    done: AtomicBool,
    clock: Arc<AtomicU64>,
    /// Looks at the socket itself, until the handshake is over.
    probe: Mutex<Option<Probe>>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("rank", &self.rank())
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl Progress {
    /// A handshake arriving now, at stage 0, ordered by `clock`.
    pub(crate) fn new(clock: Arc<AtomicU64>) -> Self {
        let order = clock.fetch_add(1, Ordering::Relaxed) & ORDER_MASK;
        Self {
            state: AtomicU64::new(order),
            done: AtomicBool::new(false),
            clock,
            probe: Mutex::new(None),
        }
    }

    /// Lets the table look at the socket: `probe` says whether the peer's
    /// bytes wait there unread. A handshake whose task has not run since
    /// its bytes came in is then not taken for a silent one: under a flood
    /// the tasks of new connections may wait their turn longer than a
    /// source's share of newcomers takes to arrive.
    #[cfg_attr(not(feature = "transport"), allow(dead_code))] // used by the transport wrappers
    pub(crate) fn set_probe(&self, probe: Probe) {
        if !self.is_finished() {
            *self.probe.lock() = Some(probe);
        }
    }

    /// Whether the peer's bytes wait unread (false without a probe).
    pub fn unread(&self) -> bool {
        self.probe.lock().as_ref().is_some_and(|p| p())
    }

    /// (stage, order it was reached in): the lower, the sooner it gives way.
    pub fn rank(&self) -> (u8, u64) {
        let s = self.state.load(Ordering::Acquire);
        ((s >> ORDER_BITS) as u8, s & ORDER_MASK)
    }

    /// The stage reached: turns of the conversation (0: not a byte yet).
    pub fn stage(&self) -> u8 {
        self.rank().0
    }

    /// One more turn (up to 255); nothing once finished. Called by the
    /// handshake's one writer.
    pub fn advance(&self) {
        if self.is_finished() {
            return;
        }
        let stage = self.stage().saturating_add(1);
        let order = self.clock.fetch_add(1, Ordering::Relaxed) & ORDER_MASK;
        self.state
            .store((u64::from(stage) << ORDER_BITS) | order, Ordering::Release);
    }

    /// The handshake is over (done, failed or shed): stop advancing.
    pub fn finish(&self) {
        self.done.store(true, Ordering::Release);
        self.probe.lock().take();
    }

    /// Whether [`Progress::finish`] was called.
    pub fn is_finished(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
}

/// The direction of the last bytes a [`Turns`] saw.
#[cfg_attr(not(feature = "transport"), allow(dead_code))] // used by the transport wrappers
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Last {
    #[default]
    Nothing,
    Received,
    Sent,
}

/// Counts turns from the bytes of one connection, as they are read and
/// written; advances a [`Progress`] at each.
#[cfg_attr(not(feature = "transport"), allow(dead_code))] // used by the transport wrappers
#[derive(Debug, Default)]
pub(crate) struct Turns {
    last: Last,
}

#[cfg_attr(not(feature = "transport"), allow(dead_code))] // used by the transport wrappers
impl Turns {
    /// `n` bytes were received: a turn if the last bytes went the other
    /// way (or none came yet).
    pub(crate) fn received(&mut self, n: usize, p: &Progress) {
        if n > 0 && self.last != Last::Received {
            self.last = Last::Received;
            p.advance();
        }
    }

    /// `n` bytes were sent: a turn if they answer received ones (our own
    /// opening bytes before the peer's are not its progress).
    pub(crate) fn sent(&mut self, n: usize, p: &Progress) {
        if n > 0 && self.last == Last::Received {
            self.last = Last::Sent;
            p.advance();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_count_answers_not_bytes() {
        let clock = Arc::new(AtomicU64::new(0));
        let p = Progress::new(clock.clone());
        let first = p.rank();
        assert_eq!(first.0, 0);
        let mut t = Turns::default();
        // Our own opening bytes are not the peer's progress.
        t.sent(10, &p);
        assert_eq!(p.stage(), 0);
        t.received(0, &p);
        assert_eq!(p.stage(), 0);
        t.received(51, &p);
        t.received(10, &p);
        assert_eq!(p.stage(), 1, "one turn however many reads");
        t.sent(80, &p);
        t.received(120, &p);
        assert_eq!(p.stage(), 3);
        assert!(p.rank().1 > first.1, "ordered after its arrival");
        p.finish();
        t.sent(5, &p);
        assert_eq!(p.stage(), 3, "finished: no more turns");
    }

    #[test]
    fn a_later_turn_ranks_after_an_earlier_one_at_the_same_stage() {
        let clock = Arc::new(AtomicU64::new(0));
        let (a, b) = (Progress::new(clock.clone()), Progress::new(clock.clone()));
        b.advance();
        a.advance();
        assert_eq!(a.stage(), b.stage());
        assert!(b.rank() < a.rank(), "b got there first, it gives way first");
    }
}
