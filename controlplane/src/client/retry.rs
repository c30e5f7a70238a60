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
/// The jitter added to a backoff is at least uniform in `[0, MIN_JITTER_SPREAD]`.
const MIN_JITTER_SPREAD: Duration = Duration::from_secs(1);
/// The jitter added to a server-assigned `retry-after`: uniform in
/// `[0, RETRY_AFTER_JITTER]`, one second, the header's resolution. The server
/// spreads refused callers over whole-second slots (a limiter serving `r`/s
/// tells `r` callers the same value), so the jitter spreads a slot's callers
/// across that second and never pushes one into slots given to later callers.
pub const RETRY_AFTER_JITTER: Duration = Duration::from_secs(1);

/// Whether a status is worth retrying: the server is busy or not reachable.
///
/// Besides `RESOURCE_EXHAUSTED`, `UNAVAILABLE` and `DEADLINE_EXCEEDED`, a
/// transport failure that tonic reports as `UNKNOWN` (a connection reset or
/// broken pipe while a control plane restarts) or as `CANCELLED` (the
/// connection closed under the call: a control plane at
/// `--grpc-max-connections` closes new connections at accept) is retried too.
pub fn is_retryable(status: &Status) -> bool {
    match status.code() {
        Code::ResourceExhausted | Code::Unavailable | Code::DeadlineExceeded => true,
        Code::Unknown | Code::Cancelled => std::error::Error::source(status)
            .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some()),
        _ => false,
    }
}

/// Whether a status proves the server did not act on the call, so that a
/// call that is not idempotent (minting a token, rotating a key) may be sent
/// again without doing its work twice.
///
/// Two cases qualify: a refusal from our server that carries `retry-after`
/// (`RESOURCE_EXHAUSTED` or `UNAVAILABLE`: limiters, the failure guard and a
/// full database queue refuse before any work is done), and a connection
/// that never opened (tonic's [`tonic::ConnectError`] in the source chain: the
/// request was never sent). A deadline, a reset or an `UNKNOWN` may have
/// come after the server acted, so they are not retried.
pub fn is_retryable_unsent(status: &Status) -> bool {
    let refused_before_acting =
        matches!(status.code(), Code::ResourceExhausted | Code::Unavailable)
            && retry_after(status).is_some();
    refused_before_acting || never_connected(status)
}

/// Whether tonic's connect error is anywhere in the status's source chain.
fn never_connected(status: &Status) -> bool {
    let mut cause = std::error::Error::source(status);
    while let Some(e) = cause {
        if e.is::<tonic::ConnectError>() {
            return true;
        }
        cause = e.source();
    }
    false
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

/// The largest jitter added to a backoff of `base` (no `retry-after` from
/// the server): half of it, at least 1 s.
pub fn jitter_bound(base: Duration) -> Duration {
    (base / 2).max(MIN_JITTER_SPREAD)
}

/// A random extra wait, uniform in `[0, bound]`.
pub(crate) fn jitter(bound: Duration) -> Duration {
    let bound = u64::try_from(bound.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(rand::thread_rng().gen_range(0..=bound))
}

/// How long to wait after a retryable refusal: the server's `retry-after`
/// plus up to [`RETRY_AFTER_JITTER`], or else `backoff` plus up to
/// [`jitter_bound`]`(backoff)`. The second value says whether the server
/// gave the wait (so the caller knows not to grow its backoff).
pub(crate) fn next_wait(status: &Status, backoff: Duration) -> (Duration, bool) {
    match retry_after(status) {
        Some(d) => (d + jitter(RETRY_AFTER_JITTER), true),
        None => (backoff + jitter(jitter_bound(backoff)), false),
    }
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
    fn a_server_wait_gets_at_most_one_second_of_jitter_whatever_its_length() {
        for secs in [1u64, 7, 60] {
            let mut s = Status::resource_exhausted("busy");
            s.metadata_mut().insert(
                RETRY_AFTER_METADATA,
                secs.to_string().parse().expect("ascii"),
            );
            let base = Duration::from_secs(secs);
            let waits: Vec<_> = (0..200).map(|_| next_wait(&s, INITIAL_BACKOFF)).collect();
            assert!(waits.iter().all(|(_, from_server)| *from_server));
            assert!(
                waits
                    .iter()
                    .all(|(w, _)| *w >= base && *w <= base + RETRY_AFTER_JITTER),
                "{secs} s: waits stay in their one-second slot"
            );
            let mut distinct: Vec<_> = waits.iter().map(|(w, _)| *w).collect();
            distinct.sort();
            distinct.dedup();
            assert!(
                distinct.len() > 150,
                "spread within the slot: {}",
                distinct.len()
            );
        }
        // No retry-after: the backoff plus up to half of it (at least 1 s).
        let s = Status::unavailable("down");
        let backoff = Duration::from_secs(8);
        let (w, from_server) = next_wait(&s, backoff);
        assert!(!from_server);
        assert!(
            w >= backoff && w <= backoff + Duration::from_secs(4),
            "{w:?}"
        );
    }

    #[test]
    fn jitter_stays_within_its_bound_and_spreads() {
        let base = jitter_bound(Duration::from_secs(1));
        let samples: Vec<_> = (0..200).map(|_| jitter(base)).collect();
        assert!(samples.iter().all(|j| *j <= base));
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

    #[test]
    fn only_outcomes_where_the_server_did_not_act_are_retried_for_unsafe_calls() {
        // Ambiguous: the server may have minted the token before the answer was lost.
        for s in [
            Status::deadline_exceeded("no answer in time"),
            Status::unknown("connection reset"),
            Status::cancelled("connection closed"),
            Status::unavailable("keepalive timed out"),
            Status::resource_exhausted("no retry-after"),
        ] {
            assert!(!is_retryable_unsent(&s), "{s:?}");
        }
        // Refused by our server before it did anything.
        for mut s in [
            Status::resource_exhausted("enroll limit"),
            Status::unavailable("database busy"),
        ] {
            s.metadata_mut()
                .insert(RETRY_AFTER_METADATA, "1".parse().expect("ascii"));
            assert!(is_retryable_unsent(&s), "{s:?}");
        }
        // A retry-after on another code is not a promise we made.
        let mut s = Status::internal("storage");
        s.metadata_mut()
            .insert(RETRY_AFTER_METADATA, "1".parse().expect("ascii"));
        assert!(!is_retryable_unsent(&s));
        // The connection never opened: the request was never sent.
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let s = Status::from_error(Box::new(tonic::ConnectError(Box::new(refused))));
        assert_eq!(s.code(), Code::Unavailable);
        assert!(is_retryable_unsent(&s));
    }
}
