//! The pause after a failed `accept()`, shared by every accept loop.
//!
//! `accept()` fails mostly when the process or the system is out of file
//! descriptors (`EMFILE`, `ENFILE`) or the kernel out of memory. Retrying at
//! once spins a core and floods the log while nothing frees up; a fixed long
//! pause would leave a listener idle after the cause is gone. So the pause
//! starts at [`AcceptBackoff::MIN`], doubles for each failure in a row up to
//! [`AcceptBackoff::MAX`], is jittered (between half and all of that) so
//! listeners hitting the same limit do not retry in lockstep, and one
//! accepted connection resets it.

use std::time::Duration;

/// Consecutive accept failures of one listener, and the pause each earns.
#[derive(Debug, Default, Clone)]
pub struct AcceptBackoff {
    failures: u32,
}

impl AcceptBackoff {
    /// Base pause after the first failure in a row.
    pub const MIN: Duration = Duration::from_millis(50);
    /// Longest base pause, reached after five failures in a row.
    pub const MAX: Duration = Duration::from_secs(1);

    /// No failure yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// An accept succeeded: the next failure pauses [`Self::MIN`] again.
    pub fn succeeded(&mut self) {
        self.failures = 0;
    }

    /// An accept failed: how long to pause before the next one.
    pub fn failed(&mut self) -> Duration {
        let pause = Self::pause(self.failures, rand::random::<f64>());
        self.failures = self.failures.saturating_add(1);
        pause
    }

    /// Failures in a row so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The pause after `earlier` failures in a row for a jitter draw `r`
    /// in `[0, 1]`: base `MIN·2^earlier` capped at `MAX`, times `0.5 + r/2`.
    /// Always within `[MIN/2, MAX]`.
    pub fn pause(earlier: u32, r: f64) -> Duration {
        let base = Self::MIN
            .saturating_mul(1u32 << earlier.min(16))
            .min(Self::MAX);
        base.mul_f64(0.5 + r.clamp(0.0, 1.0) / 2.0)
    }
}

#[cfg(test)]
mod tests {
    use super::AcceptBackoff;
    use std::time::Duration;

    #[test]
    fn the_pause_grows_from_50ms_to_1s_and_stays_within_its_bounds() {
        let ms = |n, r| AcceptBackoff::pause(n, r).as_millis();
        // Highest draw: the base itself, doubling then capped.
        let top: Vec<u128> = (0..8).map(|n| ms(n, 1.0)).collect();
        assert_eq!(top, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
        // Lowest draw: half the base.
        assert_eq!(ms(0, 0.0), 25);
        assert_eq!(ms(30, 0.0), 500);
        // Out-of-range draws and huge counts stay in bounds.
        for n in [0, 1, 4, 5, 16, 17, u32::MAX] {
            for r in [-1.0, 0.0, 0.3, 1.0, 7.0] {
                let p = AcceptBackoff::pause(n, r);
                assert!(
                    p >= AcceptBackoff::MIN / 2 && p <= AcceptBackoff::MAX,
                    "{n} {r}: {p:?}"
                );
            }
        }
    }

    #[test]
    fn failures_grow_the_pause_and_a_success_resets_it() {
        let mut b = AcceptBackoff::new();
        for _ in 0..6 {
            let p = b.failed();
            assert!(p <= AcceptBackoff::MAX);
        }
        assert_eq!(b.failures(), 6);
        // Past five failures the pause is at least half of MAX.
        assert!(b.failed() >= AcceptBackoff::MAX / 2);
        b.succeeded();
        assert_eq!(b.failures(), 0);
        assert!(b.failed() <= Duration::from_millis(50));
    }
}
