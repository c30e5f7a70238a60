//! Retry policy pieces: which statuses to retry, `retry-after`, backoff, jitter.

use std::time::Duration;

use rand::Rng;
use tonic::{Code, Status};

/// gRPC metadata key carrying whole seconds to wait before retrying.
pub const RETRY_AFTER_METADATA: &str = "retry-after";
/// First backoff when the server gave no `retry-after`: 200 ms.
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(200);
/// Backoff cap when the server gave no `retry-after`: 10 s.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// The jitter added to a wait is at least uniform in `[0, MIN_JITTER_SPREAD]`.
const MIN_JITTER_SPREAD: Duration = Duration::from_secs(1);

/// Whether a status is worth retrying: the server is busy or not reachable.
///
/// Besides `RESOURCE_EXHAUSTED`, `UNAVAILABLE` and `DEADLINE_EXCEEDED`, a
/// transport failure that tonic reports as `UNKNOWN` (a connection reset or
/// broken pipe while a control plane restarts) is retried too.
pub fn is_retryable(status: &Status) -> bool {
    match status.code() {
        Code::ResourceExhausted | Code::Unavailable | Code::DeadlineExceeded => true,
        Code::Unknown => std::error::Error::source(status)
            .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some()),
        _ => false,
    }
}

/// Parses the `retry-after` metadata (whole seconds, a decimal also accepted).
pub fn retry_after(status: &Status) -> Option<Duration> {
    let v = status.metadata().get(RETRY_AFTER_METADATA)?.to_str().ok()?;
    let secs: f64 = v.trim().parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Some(Duration::from_secs_f64(secs.min(86_400.0)))
}

/// The largest jitter added to a wait of `base`: half of it, at least 1 s.
pub fn jitter_bound(base: Duration) -> Duration {
    (base / 2).max(MIN_JITTER_SPREAD)
}

/// A random extra wait, uniform in `[0, jitter_bound(base)]`.
pub(crate) fn jitter(base: Duration) -> Duration {
    let bound = jitter_bound(base).as_micros() as u64;
    Duration::from_micros(rand::thread_rng().gen_range(0..=bound))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_parses_whole_and_decimal_seconds_and_ignores_junk() {
        let mut s = Status::resource_exhausted("busy");
        assert_eq!(retry_after(&s), None);
        s.metadata_mut()
            .insert(RETRY_AFTER_METADATA, "3".parse().expect("ascii"));
        assert_eq!(retry_after(&s), Some(Duration::from_secs(3)));
        s.metadata_mut()
            .insert(RETRY_AFTER_METADATA, "0.5".parse().expect("ascii"));
        assert_eq!(retry_after(&s), Some(Duration::from_millis(500)));
        s.metadata_mut()
            .insert(RETRY_AFTER_METADATA, "soon".parse().expect("ascii"));
        assert_eq!(retry_after(&s), None);
        s.metadata_mut()
            .insert(RETRY_AFTER_METADATA, "-1".parse().expect("ascii"));
        assert_eq!(retry_after(&s), None);
    }

    #[test]
    fn jitter_stays_within_its_bound_and_spreads() {
        let base = Duration::from_secs(1);
        let samples: Vec<_> = (0..200).map(|_| jitter(base)).collect();
        assert!(samples.iter().all(|j| *j <= jitter_bound(base)));
        let mut distinct = samples.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() > 150, "jitter is spread: {}", distinct.len());
        assert_eq!(
            jitter_bound(Duration::from_secs(10)),
            Duration::from_secs(5)
        );
        assert!(is_retryable(&Status::unavailable("x")));
        assert!(!is_retryable(&Status::unauthenticated("x")));
    }
}
