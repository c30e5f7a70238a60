//! The endpoints a client dials (the control plane's replicas) and which
//! one a call or a watch goes to.
//!
//! Unary calls stay on one endpoint (`current`) and move to the next when
//! an attempt gets no answer, so a client keeps one connection while its
//! replica serves. A watch, held for minutes by a router, is placed
//! instead: the k-th watch a client opens goes first to endpoint
//! `start + k` (mod the count), `start` random per client unless given.
//! Each reopen of a moved watch (the replica ended it at its maximum age)
//! so goes to the next replica of the client's own rotation, whatever
//! replica it was on: watches that all landed on the replicas that came
//! up first (the others were not up yet, or stopping) are spread again
//! after one maximum age, the same way random starts spread them at first,
//! and a test choosing the starts gets an exact spread.
//!
//! An endpoint whose replica said it is stopping is avoided by every call
//! and watch for [`STOPPING_AVOID`] (it closes its listener and exits
//! within its shutdown grace; a restarted one is tried again after it).
//! When every endpoint is avoided, the one whose mark ends first is used.

use std::{
    sync::{
        OnceLock,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use tonic::transport::{Channel, Endpoint};

/// How long calls avoid an endpoint whose replica said it is stopping:
/// past a replica's shutdown grace (default 10 s), short enough that a
/// replica restarted in a rollout is used again soon after.
pub const STOPPING_AVOID: Duration = Duration::from_secs(15);

/// One address to dial, its held channel, and until when it is avoided.
pub(super) struct Dial {
    pub(super) address: String,
    pub(super) endpoint: Endpoint,
    pub(super) channel: OnceLock<Channel>,
    /// Avoided until this instant of the client's clock, in milliseconds
    /// (0: not avoided).
    avoid_until_ms: AtomicU64,
}

impl Dial {
    pub(super) fn new(address: String, endpoint: Endpoint) -> Self {
        Self {
            address,
            endpoint,
            channel: OnceLock::new(),
            avoid_until_ms: AtomicU64::new(0),
        }
    }

    fn avoided_until(&self) -> u64 {
        self.avoid_until_ms.load(Ordering::Relaxed)
    }
}

/// The endpoints and where calls and watches go.
pub(super) struct Endpoints {
    dials: Vec<Dial>,
    /// The endpoint unary calls use now; moved on when one fails to answer.
    current: AtomicUsize,
    /// Where the next watch opens first (before avoided endpoints are
    /// skipped): the client's start plus the watches opened so far.
    next_watch: AtomicUsize,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Endpoints {
    /// `dials` (at least one); watches start at `watch_start`, or at a
    /// random endpoint.
    pub(super) fn new(dials: Vec<Dial>, watch_start: Option<usize>) -> Self {
        let start = watch_start.unwrap_or_else(|| rand::random::<u32>() as usize);
        Self {
            dials,
            current: AtomicUsize::new(0),
            next_watch: AtomicUsize::new(start),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.dials.len()
    }

    pub(super) fn get(&self, i: usize) -> &Dial {
        &self.dials[i % self.dials.len()]
    }

    /// The index of `address`, if it is one of ours.
    pub(super) fn index_of(&self, address: &str) -> Option<usize> {
        self.dials.iter().position(|d| d.address == address)
    }

    /// From `from` round the ring, the first endpoint not avoided at `now`;
    /// when every one is, the one whose mark ends first.
    fn usable_from(&self, from: usize, now: Duration) -> usize {
        let (n, now) = (self.dials.len(), ms(now));
        let ring = (0..n).map(|k| (from + k) % n);
        ring.clone()
            .find(|&i| self.dials[i].avoided_until() <= now)
            .or_else(|| ring.min_by_key(|&i| self.dials[i].avoided_until()))
            .unwrap_or(0)
    }

    /// Where a unary call starts: the current endpoint, or past it when it
    /// is avoided (which makes the one chosen current).
    pub(super) fn for_call(&self, now: Duration) -> usize {
        let current = self.current.load(Ordering::Relaxed) % self.dials.len();
        let i = self.usable_from(current, now);
        if i != current {
            self.current.store(i, Ordering::Relaxed);
        }
        i
    }

    /// Where the next watch opens first: the next of the rotation, past
    /// avoided endpoints.
    pub(super) fn for_watch(&self, now: Duration) -> usize {
        let k = self.next_watch.fetch_add(1, Ordering::Relaxed) % self.dials.len();
        self.usable_from(k, now)
    }

    /// After endpoint `failed` gave no answer: the next one not avoided,
    /// made current so later calls go there too. With one endpoint, that
    /// one.
    pub(super) fn after_failure(&self, failed: usize, now: Duration) -> usize {
        let n = self.dials.len();
        if n == 1 {
            return 0;
        }
        let next = self.usable_from((failed + 1) % n, now);
        // `failed` itself only when every other one is avoided longer.
        let _ =
            self.current
                .compare_exchange(failed % n, next, Ordering::Relaxed, Ordering::Relaxed);
        tracing::debug!(failed = %self.dials[failed % n].address, next = %self.dials[next].address, "control plane endpoint did not answer; trying the next");
        next
    }

    /// Avoids endpoint `i` until `until` on the client's clock.
    pub(super) fn avoid(&self, i: usize, until: Duration) {
        self.dials[i % self.dials.len()]
            .avoid_until_ms
            .fetch_max(ms(until), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(n: usize, watch_start: Option<usize>) -> Endpoints {
        let dials = (0..n)
            .map(|i| {
                let address = format!("http://10.0.0.{i}:7400");
                let endpoint = Endpoint::from_shared(address.clone()).expect("url");
                Dial::new(address, endpoint)
            })
            .collect();
        Endpoints::new(dials, watch_start)
    }

    const T0: Duration = Duration::from_secs(100);

    #[test]
    fn watches_rotate_from_the_clients_start_whatever_they_were_on() {
        let e = endpoints(3, Some(1));
        let firsts: Vec<_> = (0..6).map(|_| e.for_watch(T0)).collect();
        assert_eq!(firsts, [1, 2, 0, 1, 2, 0]);
        // Six clients starting 0..6 spread their k-th watches evenly, for
        // every k: two on each of three endpoints.
        for k in 0..4 {
            let mut on = [0; 3];
            for start in 0..6 {
                let e = endpoints(3, Some(start));
                for _ in 0..k {
                    e.for_watch(T0);
                }
                on[e.for_watch(T0)] += 1;
            }
            assert_eq!(on, [2, 2, 2], "watch {k}");
        }
    }

    #[test]
    fn a_stopping_endpoint_is_skipped_until_its_mark_ends() {
        let e = endpoints(3, Some(0));
        e.avoid(0, T0 + STOPPING_AVOID);
        assert_eq!(e.for_watch(T0), 1, "the rotation's 0 is avoided");
        assert_eq!(e.for_call(T0), 1, "calls leave it too");
        assert_eq!(e.after_failure(1, T0), 2);
        assert_eq!(e.for_call(T0), 2, "the next is current now");
        // Marks end.
        assert_eq!(e.for_watch(T0 + STOPPING_AVOID), 1);
        assert_eq!(e.for_watch(T0 + STOPPING_AVOID), 2);
        assert_eq!(e.for_watch(T0 + STOPPING_AVOID), 0);
        // All avoided: the one whose mark ends first.
        e.avoid(0, T0 + Duration::from_secs(30));
        e.avoid(1, T0 + Duration::from_secs(20));
        e.avoid(2, T0 + Duration::from_secs(40));
        assert_eq!(e.for_call(T0), 1);
        assert_eq!(e.for_watch(T0), 1);
        // A mark is never shortened by a later, shorter one.
        e.avoid(2, T0);
        assert_eq!(e.usable_from(2, T0 + Duration::from_secs(35)), 0);
    }

    #[test]
    fn one_endpoint_is_always_the_one() {
        let e = endpoints(1, None);
        e.avoid(0, T0 + STOPPING_AVOID);
        assert_eq!(
            (e.for_call(T0), e.for_watch(T0), e.after_failure(0, T0)),
            (0, 0, 0)
        );
    }
}
