//! The database half of `/readyz`: a replica leaves its Service only when
//! its database has failed every ping for `--db-unready-after-secs`.
//!
//! Every replica shares one database, so a blip of a second (a failover, a
//! restart, a pool reconnecting) would otherwise take every replica out of
//! the Service at once, turning a retryable UNAVAILABLE into connection
//! refusals for every member and router. Within the grace a replica stays
//! ready and its RPCs answer UNAVAILABLE with their own `retry-after`;
//! past it, not ready. One success ends the outage.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

/// What `/readyz` answers for the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbVerdict {
    /// The ping answered.
    Ready,
    /// Failing for `for_` (< the grace): still ready.
    Failing {
        /// Since the first failure after the last success.
        for_: Duration,
    },
    /// Failing for `for_` (≥ the grace): not ready.
    Unready {
        /// Since the first failure after the last success.
        for_: Duration,
    },
}

/// The database's health as `/readyz` has seen it; its one writer is
/// [`DbHealth::observe`].
#[derive(Debug)]
pub struct DbHealth {
    grace: Duration,
    failing_since: Mutex<Option<Instant>>,
}

impl DbHealth {
    /// Not ready after `grace` of failed pings.
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            failing_since: Mutex::new(None),
        }
    }

    /// Records one ping's outcome at `now` and says what to answer.
    pub fn observe(&self, ok: bool, now: Instant) -> DbVerdict {
        let mut since = self
            .failing_since
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if ok {
            *since = None;
            return DbVerdict::Ready;
        }
        let first = *since.get_or_insert(now);
        let for_ = now.saturating_duration_since(first);
        if for_ >= self.grace {
            DbVerdict::Unready { for_ }
        } else {
            DbVerdict::Failing { for_ }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blip_shorter_than_the_grace_keeps_the_replica_ready() {
        let h = DbHealth::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(h.observe(true, t0), DbVerdict::Ready);
        assert_eq!(
            h.observe(false, t0 + Duration::from_secs(1)),
            DbVerdict::Failing {
                for_: Duration::ZERO
            }
        );
        assert_eq!(
            h.observe(false, t0 + Duration::from_secs(10)),
            DbVerdict::Failing {
                for_: Duration::from_secs(9)
            }
        );
        // One success ends the outage; the next failure starts a new one.
        assert_eq!(
            h.observe(true, t0 + Duration::from_secs(11)),
            DbVerdict::Ready
        );
        assert_eq!(
            h.observe(false, t0 + Duration::from_secs(12)),
            DbVerdict::Failing {
                for_: Duration::ZERO
            }
        );
    }

    #[test]
    fn failing_for_the_whole_grace_makes_it_unready_until_a_success() {
        let h = DbHealth::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(matches!(h.observe(false, t0), DbVerdict::Failing { .. }));
        assert_eq!(
            h.observe(false, t0 + Duration::from_secs(10)),
            DbVerdict::Unready {
                for_: Duration::from_secs(10)
            }
        );
        assert_eq!(
            h.observe(false, t0 + Duration::from_secs(30)),
            DbVerdict::Unready {
                for_: Duration::from_secs(30)
            }
        );
        assert_eq!(
            h.observe(true, t0 + Duration::from_secs(31)),
            DbVerdict::Ready
        );
    }

    #[test]
    fn a_zero_grace_is_unready_at_the_first_failure() {
        let h = DbHealth::new(Duration::ZERO);
        let t0 = Instant::now();
        assert_eq!(
            h.observe(false, t0),
            DbVerdict::Unready {
                for_: Duration::ZERO
            }
        );
    }
}
