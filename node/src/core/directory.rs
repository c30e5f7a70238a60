//! Directory refresh: the router directory (and the key set, and the
//! revocations and the signed policy served beside it) is fetched at start, then every
//! `--directory-interval-secs` ±20%, so a fleet does not come back
//! together; a failure is retried after a jittered backoff from 2 s up to
//! the interval or [`RETRY_MAX`], whichever is shorter (a long interval
//! must not leave a member without a directory for long). Between fetches
//! the cached directory is used, so a router's death does not send the
//! fleet to the control plane at once.
//!
//! The key set is written to the data dir only when it changed: a write is
//! an fsync, and a fleet of thousands of members sharing a disk rewrote
//! the same bytes every interval.
//!
//! [`Directory`] is the schedule and the cache: pure transitions taking
//! `now`, tested without a swarm; the fetch runs as a core op.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use agentmesh_controlplane::client::{ClientError, HeldPolicyVersion};
use agentmesh_proto::pb::controlplane::GetDirectoryResponse;
use agentmesh_proto::pb::credential::KeySet;
use libp2p::{Multiaddr, PeerId};
use tokio::time::Instant;

use super::{Core, Op, backoff, jittered};
use crate::select::Candidate;

/// Shortest pause before retrying a failed fetch (doubling per failure, up
/// to the interval).
const RETRY_MIN: Duration = Duration::from_secs(2);
/// Longest pause before retrying a failed fetch, whatever the interval.
const RETRY_MAX: Duration = Duration::from_secs(60);

/// The cached directory and when to fetch it next.
#[derive(Debug, Clone)]
pub(crate) struct Directory {
    interval: Duration,
    next: Instant,
    failures: u32,
    in_flight: bool,
    /// A fetch has succeeded once: routers can be chosen.
    have: bool,
    /// Routers from the directory, then go-away alternatives not in it.
    candidates: Vec<Candidate>,
    /// Their addresses, shared with call tasks in [`crate::shared::Routes`].
    addrs: Arc<HashMap<PeerId, Vec<Multiaddr>>>,
    /// The key set last written to the data dir (by this schedule).
    keys_stored: Option<KeySet>,
}

impl Directory {
    /// Nothing fetched yet; the first fetch is due at `now`.
    pub(crate) fn new(interval: Duration, now: Instant) -> Self {
        Self {
            interval: interval.max(Duration::from_secs(1)),
            next: now,
            failures: 0,
            in_flight: false,
            have: false,
            candidates: Vec::new(),
            addrs: Arc::default(),
            keys_stored: None,
        }
    }

    /// Whether a fetch should start now.
    pub(crate) fn due(&self, now: Instant) -> bool {
        !self.in_flight && now >= self.next
    }

    /// A fetch started.
    pub(crate) fn started(&mut self) {
        self.in_flight = true;
    }

    /// A fetch at `now` returned `routers`: they replace the candidates.
    /// Returns the wait before the next fetch (the interval ±20%).
    pub(crate) fn fetched(&mut self, routers: Vec<Candidate>, now: Instant) -> Duration {
        self.in_flight = false;
        self.failures = 0;
        self.have = true;
        self.candidates = routers;
        self.reindex();
        let wait = jittered(self.interval.mul_f64(0.8), 0.5);
        self.next = now + wait;
        wait
    }

    /// A fetch failed at `now`: the cache stays; retried after the returned backoff.
    pub(crate) fn failed(&mut self, now: Instant) -> Duration {
        self.in_flight = false;
        self.failures += 1;
        let wait = backoff(self.failures, RETRY_MIN, self.interval.min(RETRY_MAX));
        self.next = now + wait;
        wait
    }

    /// Whether `keys` differ from the set last stored; if so they count as
    /// stored from now on (the caller writes them).
    pub(crate) fn keys_to_store(&mut self, keys: &KeySet) -> bool {
        if self.keys_stored.as_ref() == Some(keys) {
            return false;
        }
        self.keys_stored = Some(keys.clone());
        true
    }

    /// Adds routers (a go-away's alternatives) not already known; directory
    /// entries win. Returns how many were added.
    pub(crate) fn merge(&mut self, more: Vec<Candidate>) -> usize {
        let before = self.candidates.len();
        for c in more {
            if !self.candidates.iter().any(|k| k.peer == c.peer) {
                self.candidates.push(c);
            }
        }
        let added = self.candidates.len() - before;
        if added > 0 {
            self.reindex();
        }
        added
    }

    fn reindex(&mut self) {
        self.addrs = Arc::new(
            self.candidates
                .iter()
                .map(|c| (c.peer, c.addrs.clone()))
                .collect(),
        );
    }

    /// Whether a fetch has succeeded once.
    pub(crate) fn have(&self) -> bool {
        self.have
    }

    /// The routers to choose from.
    pub(crate) fn candidates(&self) -> &[Candidate] {
        &self.candidates
    }

    /// Their addresses (cheap to clone).
    pub(crate) fn addrs(&self) -> Arc<HashMap<PeerId, Vec<Multiaddr>>> {
        self.addrs.clone()
    }

    /// The routers known now.
    pub(crate) fn known(&self) -> HashSet<PeerId> {
        self.candidates.iter().map(|c| c.peer).collect()
    }
}

impl Core {
    pub(super) fn start_directory(&mut self) {
        self.directory.started();
        let shared = self.shared.clone();
        self.ops.push(Box::pin(async move {
            let r = async {
                // Naming the copy we hold: an unchanged policy is not sent.
                let held = shared.policy.held().map(|h| HeldPolicyVersion {
                    epoch: h.epoch,
                    version: h.version,
                });
                let dir = shared.client.get_directory_holding(held.as_ref()).await?;
                let keys = shared.client.get_keys().await?;
                // The policy served beside the directory, verified with the
                // keys just fetched (a rotation may have re-signed it).
                if let Some(signed) = dir.policy.clone() {
                    let mut trust = (*shared.trust()).clone();
                    trust.set_keys(&keys);
                    shared
                        .policy
                        .offer(signed, Arc::new(trust), crate::policy::DIRECTORY)
                        .await;
                }
                Ok((dir, keys))
            }
            .await;
            Op::Directory(Box::new(r))
        }));
    }

    pub(super) fn on_directory(
        &mut self,
        result: Result<(GetDirectoryResponse, KeySet), ClientError>,
    ) {
        match result {
            Ok((dir, keys)) => {
                self.shared.metrics.cp("directory", true);
                self.shared.set_keys(&keys);
                // The control plane's signed list, verified with the keys
                // just installed; taken only if newer than the one held.
                if let Some(list) = dir.revocations.as_ref() {
                    self.shared.policy.offer_revocations(
                        &self.shared.trust,
                        list,
                        agentmesh_proto::unix_now(),
                        crate::policy::DIRECTORY,
                    );
                }
                let routers = dir
                    .routers
                    .iter()
                    .filter_map(Candidate::from_info)
                    .collect();
                self.directory.fetched(routers, Instant::now());
                let known = self.directory.known();
                self.choice.forget_unknown(&known);
                if self.directory.keys_to_store(&keys) {
                    let dir_path = self.shared.config.data_dir.clone();
                    tokio::task::spawn_blocking(move || {
                        if let Err(e) = crate::identity::store_keys(&dir_path, &keys) {
                            tracing::warn!(error = %e, "could not store the key set");
                        }
                    });
                }
                self.top_up();
                self.publish_status();
            }
            Err(e) => {
                self.shared.metrics.cp("directory", false);
                let wait = self.directory.failed(Instant::now());
                tracing::warn!(error = %e, retry_in = ?wait, "directory fetch failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand() -> Candidate {
        Candidate {
            peer: PeerId::random(),
            addrs: vec!["/ip4/127.0.0.1/tcp/1".parse().expect("addr")],
            labels: Default::default(),
            load: 0.0,
            draining: false,
        }
    }

    #[test]
    fn fetched_every_interval_within_twenty_percent_and_failures_keep_the_cache() {
        let now = Instant::now();
        let interval = Duration::from_secs(60);
        let mut d = Directory::new(interval, now);
        assert!(d.due(now) && !d.have());
        d.started();
        assert!(!d.due(now), "one fetch at a time");
        let a = cand();
        let wait = d.fetched(vec![a.clone()], now);
        assert!(d.have());
        assert!(
            wait >= interval.mul_f64(0.8) && wait <= interval.mul_f64(1.2),
            "{wait:?}"
        );
        assert!(!d.due(now + wait - Duration::from_millis(1)) && d.due(now + wait));
        assert_eq!(d.addrs().get(&a.peer), Some(&a.addrs));
        // Failures back off from 2 s up to the interval (here below
        // RETRY_MAX), and keep what was fetched.
        for n in 1..=10u32 {
            d.started();
            let w = d.failed(now);
            let base = RETRY_MIN.saturating_mul(1 << n).min(interval);
            assert!(w >= base && w <= base.mul_f64(1.5), "{n}: {w:?}");
        }
        assert_eq!(d.candidates().len(), 1);
        assert!(d.have());
        // A success resets the backoff.
        d.fetched(vec![a], now);
        assert!(d.failed(now) <= RETRY_MIN.saturating_mul(2).mul_f64(1.5));
    }

    #[test]
    fn a_long_interval_does_not_stretch_the_retries_of_a_failed_fetch() {
        let now = Instant::now();
        let mut d = Directory::new(Duration::from_secs(3_600), now);
        for _ in 0..20 {
            d.started();
            let w = d.failed(now);
            assert!(w <= RETRY_MAX.mul_f64(1.5), "{w:?}");
        }
    }

    #[test]
    fn the_key_set_is_stored_only_when_it_changed() {
        use agentmesh_proto::pb::credential::PublicKey;
        let now = Instant::now();
        let mut d = Directory::new(Duration::from_secs(60), now);
        let one = KeySet {
            keys: vec![PublicKey {
                key_id: "k1".into(),
                ..Default::default()
            }],
        };
        assert!(d.keys_to_store(&one), "first fetch: stored");
        assert!(!d.keys_to_store(&one.clone()), "same bytes: not again");
        let mut two = one.clone();
        two.keys.push(PublicKey {
            key_id: "k2".into(),
            ..Default::default()
        });
        assert!(d.keys_to_store(&two), "a rotation: stored");
        assert!(!d.keys_to_store(&two));
        assert!(d.keys_to_store(&one), "a key past its grace: stored");
    }

    #[test]
    fn alternatives_add_unknown_routers_and_the_directory_wins() {
        let now = Instant::now();
        let mut d = Directory::new(Duration::from_secs(60), now);
        let (a, b) = (cand(), cand());
        d.fetched(vec![a.clone()], now);
        let mut a_elsewhere = a.clone();
        a_elsewhere.addrs = vec!["/ip4/10.0.0.1/tcp/9".parse().expect("addr")];
        assert_eq!(d.merge(vec![a_elsewhere, b.clone()]), 1);
        assert_eq!(d.addrs().get(&a.peer), Some(&a.addrs));
        assert_eq!(d.addrs().get(&b.peer), Some(&b.addrs));
        assert_eq!(d.known(), [a.peer, b.peer].into());
        // The next fetch replaces them all.
        d.fetched(vec![a.clone()], now);
        assert_eq!(d.known(), [a.peer].into());
    }
}
