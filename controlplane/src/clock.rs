//! A monotonic clock that can be swapped out in tests.
//!
//! The enrollment limiter (server) and the client's backoff both read time
//! through [`Clock`], so a fleet test can share one simulated clock between a
//! real server and many real clients and run minutes of retries in well under
//! a second. Wall-clock instants (credential expiry, proof timestamps) do not
//! go through this trait: they use [`agentmesh_proto::unix_now`].

use std::{fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

/// A boxed future returned by [`Clock::sleep`].
pub type SleepFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Monotonic time and sleeping, as the limiter and the retry loop see them.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Time elapsed since this clock's origin.
    fn now(&self) -> Duration;
    /// A future that completes once `dur` has passed on this clock.
    fn sleep(&self, dur: Duration) -> SleepFuture;
}

/// A shareable clock.
pub type SharedClock = Arc<dyn Clock>;

/// A clock for one caller in tests: sleeping advances time at once, so a
/// retry loop runs its whole budget without waiting.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct SkipClock(std::sync::Mutex<Duration>);

#[cfg(test)]
impl Clock for SkipClock {
    fn now(&self) -> Duration {
        *self.0.lock().expect("not poisoned")
    }
    fn sleep(&self, dur: Duration) -> SleepFuture {
        *self.0.lock().expect("not poisoned") += dur;
        Box::pin(std::future::ready(()))
    }
}

/// The real clock: `tokio::time`, so `tokio::time::pause` also works with it.
#[derive(Debug, Clone)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }

    /// [`TokioClock::new`] behind an `Arc`.
    pub fn shared() -> SharedClock {
        Arc::new(Self::new())
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn sleep(&self, dur: Duration) -> SleepFuture {
        Box::pin(tokio::time::sleep(dur))
    }
}
