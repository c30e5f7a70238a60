//! Credential refresh: two thirds through the credential's lifetime (minus
//! up to a tenth of it as jitter) the engine asks the control plane for a new
//! one; a failure is retried after a jittered exponential backoff (5 s
//! doubling to 2 min). A refusal for good (unknown node, expired past the
//! grace) enrolls again when the node still has its token. A new
//! credential is stored in the data dir and re-presented to every router.
//!
//! [`Refresh`] is the schedule: pure transitions taking `now`, so it is
//! tested without a swarm; the exchange runs as an engine op.

use std::time::Duration;

use agentmesh_controlplane::client::ClientError;
use agentmesh_proto::credential::peek_claims;
use agentmesh_proto::pb::controlplane::RefreshResponse;
use agentmesh_proto::unix_now;
use rand::Rng;
use tokio::time::Instant;

use super::{Engine, Op, backoff};

/// Shortest pause before retrying a failed refresh (doubling per failure).
const RETRY_MIN: Duration = Duration::from_secs(5);
/// Longest pause before retrying a failed refresh.
const RETRY_MAX: Duration = Duration::from_secs(120);
/// Shortest credential lifetime the schedule assumes, seconds.
const MIN_LIFETIME_SECS: i64 = 3;

/// When the next refresh is due, and whether one is under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refresh {
    next: Instant,
    failures: u32,
    in_flight: bool,
}

impl Refresh {
    /// A schedule due at `now` (set properly by [`Refresh::schedule`]).
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            next: now,
            failures: 0,
            in_flight: false,
        }
    }

    /// Whether a refresh should start now.
    pub(crate) fn due(&self, now: Instant) -> bool {
        !self.in_flight && now >= self.next
    }

    /// A refresh started.
    pub(crate) fn started(&mut self) {
        self.in_flight = true;
    }

    /// Schedules the next refresh for a credential issued at `issued` and
    /// expiring at `expires` (Unix seconds), it being `now_unix` (Unix
    /// seconds) and `now`; `jitter` in `[0, 1]` picks how much of a tenth of
    /// the lifetime comes off. Returns the wait.
    pub(crate) fn schedule(
        &mut self,
        issued: i64,
        expires: i64,
        now_unix: i64,
        now: Instant,
        jitter: f64,
    ) -> Duration {
        let lifetime = (expires - issued).max(MIN_LIFETIME_SECS);
        let off = ((lifetime / 10) as f64 * jitter.clamp(0.0, 1.0)) as i64;
        let at = issued + lifetime * 2 / 3 - off;
        let wait = Duration::from_secs((at - now_unix).max(1) as u64);
        self.next = now + wait;
        wait
    }

    /// The refresh succeeded (schedule the next with [`Refresh::schedule`]).
    pub(crate) fn succeeded(&mut self) {
        self.in_flight = false;
        self.failures = 0;
    }

    /// The refresh failed at `now`: retried after the returned backoff.
    pub(crate) fn failed(&mut self, now: Instant) -> Duration {
        self.in_flight = false;
        self.failures += 1;
        let wait = backoff(self.failures, RETRY_MIN, RETRY_MAX);
        self.next = now + wait;
        wait
    }
}

impl Engine {
    /// Schedules the next refresh from the current credential and shows its expiry.
    pub(super) fn schedule_refresh(&mut self) {
        let claims = peek_claims(&self.node.credential()).unwrap_or_default();
        let jitter = rand::thread_rng().gen_range(0.0..=1.0);
        self.refresh.schedule(
            claims.issued_at_unix_secs,
            claims.expires_at_unix_secs,
            unix_now(),
            Instant::now(),
            jitter,
        );
        self.node
            .metrics
            .routers
            .credential_expires_at
            .set(claims.expires_at_unix_secs);
    }

    pub(super) fn start_refresh(&mut self) {
        self.refresh.started();
        let node = self.node.clone();
        self.ops.push(Box::pin(async move {
            let cred = node.credential();
            let r = match node.client.refresh(&cred, &node.key).await {
                // Refused for good (unknown node, expired past the grace):
                // enroll again if we still have a token.
                Err(ClientError::Refused(status))
                    if !node.config.control_plane.token.is_empty() =>
                {
                    tracing::warn!(%status, "refresh refused: enrolling again with the token");
                    let e = node
                        .client
                        .enroll(&node.config.control_plane.token, &node.key)
                        .await;
                    node.metrics.cp("enroll", e.is_ok());
                    e.map(|e| RefreshResponse {
                        credential: e.credential,
                        keys: e.keys,
                    })
                }
                other => other,
            };
            Op::Refresh(Box::new(r))
        }));
    }

    pub(super) fn on_refresh(&mut self, result: Result<RefreshResponse, ClientError>) {
        let fresh = result.map_err(|e| e.to_string()).and_then(|r| {
            let cred = r.credential.ok_or("refresh answer without credential")?;
            Ok((cred, r.keys))
        });
        match fresh {
            Ok((cred, keys)) => {
                self.node.metrics.cp("refresh", true);
                self.refresh.succeeded();
                *self.node.credential.write() = cred.clone();
                self.swarm
                    .behaviour_mut()
                    .direct
                    .set_credential(cred.clone());
                // Stored only when taken: an older set is not kept.
                let keys = keys.filter(|k| self.node.set_keys(k));
                let dir = self.node.config.data_dir.clone();
                tokio::task::spawn_blocking(move || {
                    if let Err(e) = crate::identity::store_credential(&dir, &cred) {
                        tracing::warn!(error = %e, "could not store the refreshed credential");
                    }
                    if let Some(Err(e)) = keys.map(|k| crate::identity::store_keys(&dir, &k)) {
                        tracing::warn!(error = %e, "could not store the key set");
                    }
                });
                self.schedule_refresh();
                // Our records carry the credential: publish the new one.
                self.records.dirty = true;
                self.represent_all();
                // Routers that refused the old credential as revoked judge
                // this one (see `shun::Choice::new_credential`).
                if self.choice.new_credential() > 0 {
                    self.top_up();
                }
                self.publish_status();
            }
            Err(e) => {
                self.node.metrics.cp("refresh", false);
                let wait = self.refresh.failed(Instant::now());
                tracing::warn!(error = %e, retry_in = ?wait, "credential refresh failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_two_thirds_through_the_lifetime_less_the_jitter() {
        let now = Instant::now();
        let mut r = Refresh::new(now);
        assert!(r.due(now), "a new schedule is due until scheduled");
        // Issued at 1000, expires at 1900 (15 min): due at 1600, up to 90 s early.
        assert_eq!(
            r.schedule(1000, 1900, 1000, now, 0.0),
            Duration::from_secs(600)
        );
        assert!(!r.due(now + Duration::from_secs(599)));
        assert!(r.due(now + Duration::from_secs(600)));
        assert_eq!(
            r.schedule(1000, 1900, 1000, now, 1.0),
            Duration::from_secs(510)
        );
        // Already past the point (a restart late in the lifetime): soon, never at once.
        assert_eq!(
            r.schedule(1000, 1900, 1800, now, 0.5),
            Duration::from_secs(1)
        );
        // A degenerate lifetime is taken as 3 s: two thirds of it.
        assert_eq!(
            r.schedule(1000, 1000, 1000, now, 0.0),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn one_refresh_at_a_time_and_failures_back_off_then_reset() {
        let now = Instant::now();
        let mut r = Refresh::new(now);
        r.started();
        assert!(!r.due(now + Duration::from_secs(3600)), "one in flight");
        let mut last = Duration::ZERO;
        for n in 1..=8u32 {
            let wait = r.failed(now);
            assert!(!r.in_flight);
            let base = RETRY_MIN.saturating_mul(1 << n).min(RETRY_MAX);
            assert!(wait >= base && wait <= base.mul_f64(1.5), "{n}: {wait:?}");
            assert!(!r.due(now + wait - Duration::from_millis(1)));
            assert!(r.due(now + wait));
            last = wait;
            r.started();
        }
        assert!(last <= RETRY_MAX.mul_f64(1.5));
        r.succeeded();
        assert_eq!(r.failures, 0);
        let first = r.failed(now);
        assert!(
            first <= RETRY_MIN.saturating_mul(2).mul_f64(1.5),
            "{first:?}"
        );
    }
}
