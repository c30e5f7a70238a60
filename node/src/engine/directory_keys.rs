//! Which directory fetches read the key set too. A fetch on the interval's
//! schedule always does (a rotation is seen within an interval). A fetch
//! in a hurry (no router held: a whole mesh restarting, every member
//! asking at once) reads it only when it must: when the keys held are
//! older than the interval, or when a signature the directory carries (the
//! policy's, the revocation list's) names a key the member does not hold,
//! or holds past its grace. The keys cannot have changed in a way that
//! matters otherwise, and skipping them halves the calls a returning
//! fleet makes to the control plane, each on a connection of its own.

use std::time::Duration;

use agentmesh_proto::credential::Trust;
use agentmesh_proto::pb::controlplane::GetDirectoryResponse;
use tokio::time::Instant;

/// When the member last read the key set with the directory, and the rule
/// above.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeysRead {
    at: Option<Instant>,
}

impl KeysRead {
    /// Whether a fetch starting at `now` must read the keys whatever the
    /// directory says: on the interval's schedule (`hurried` false), or
    /// when none were read within `interval`.
    pub(crate) fn due(&self, hurried: bool, interval: Duration, now: Instant) -> bool {
        !hurried
            || self
                .at
                .is_none_or(|at| now.saturating_duration_since(at) >= interval)
    }

    /// The key set was read at `now`.
    pub(crate) fn read(&mut self, now: Instant) {
        self.at = Some(now);
    }
}

/// Whether `dir` carries a signature by a key `trust` lacks, or (the
/// revocation list's) by one past its grace at `now` (Unix seconds). An
/// undecodable document needs no keys: it fails verification whatever
/// they are.
pub(crate) fn signed_by_key_not_held(dir: &GetDirectoryResponse, trust: &Trust, now: i64) -> bool {
    let policy = dir
        .policy
        .as_ref()
        .and_then(agentmesh_proto::policy::peek_document)
        .is_some_and(|d| !trust.has_key(&d.key_id));
    let revocations = dir
        .revocations
        .as_ref()
        .and_then(agentmesh_proto::revocations::peek_list)
        .is_some_and(|l| match trust.verify_until(&l.key_id) {
            None => true,
            Some(until) => until != 0 && now > until,
        });
    policy || revocations
}

#[cfg(test)]
mod tests {
    use agentmesh_proto::testing::TestCp;

    use super::*;

    #[test]
    fn a_hurried_fetch_reads_the_keys_only_when_none_were_read_within_the_interval() {
        let interval = Duration::from_secs(300);
        let now = Instant::now();
        let mut k = KeysRead::default();
        assert!(k.due(true, interval, now), "none read yet");
        k.read(now);
        assert!(!k.due(true, interval, now + Duration::from_secs(10)));
        assert!(
            k.due(false, interval, now + Duration::from_secs(10)),
            "the interval's fetch always reads them"
        );
        assert!(k.due(true, interval, now + interval));
    }

    #[test]
    fn a_directory_signed_by_a_key_not_held_needs_the_keys() {
        let cp = TestCp::new();
        let held = Trust::new(&cp.key_set());
        let now = 1_000;
        let with = |signer: &TestCp| GetDirectoryResponse {
            policy: Some(signer.policy(1, 2, now, "")),
            revocations: Some(signer.revocations(1, 3, now, &[])),
            ..Default::default()
        };
        assert!(!signed_by_key_not_held(&with(&cp), &held, now));
        assert!(!signed_by_key_not_held(
            &GetDirectoryResponse::default(),
            &held,
            now
        ));
        let none = Trust::new(&Default::default());
        assert!(
            signed_by_key_not_held(&with(&cp), &none, now),
            "no keys held"
        );
        let policy_only = GetDirectoryResponse {
            policy: Some(cp.policy(1, 2, now, "")),
            ..Default::default()
        };
        assert!(signed_by_key_not_held(&policy_only, &none, now));
        // The list's key held, but past its grace: a rotation since.
        let mut retired = cp.key_set();
        retired.keys[0].verify_until_unix_secs = now - 1;
        let retired = Trust::new(&retired);
        let list_only = GetDirectoryResponse {
            revocations: Some(cp.revocations(1, 3, now, &[])),
            ..Default::default()
        };
        assert!(signed_by_key_not_held(&list_only, &retired, now));
        assert!(
            !signed_by_key_not_held(&policy_only, &retired, now),
            "a policy verifies past the grace"
        );
    }
}
