//! Shunned routers: kept out of the choice for a while after they failed,
//! refused or sent go-away. Failures in a row double the shun (up to ×16),
//! which is right while other routers are free; but a node that is short of
//! K routers with nothing else to pick would sit below K for minutes. So
//! when fewer than K free candidates remain, a shunned router is tried again
//! once its *undoubled* base has passed ([`Shun::early`]), the one whose
//! shun ends soonest first; routers that are leaving (go-away or refusal
//! DRAINING) never are, nor routers that refused our credential as revoked:
//! revocations are mesh-wide and final, so asking again with the same
//! credential only costs the router an auth; such a shun ends early only
//! when the credential changes ([`Choice::new_credential`]).
//!
//! A leaving router's shun (up to an hour) would outlast its restart: after
//! a whole mesh restarts every member would sit with no router while the
//! routers answer again. So a directory fetched after the shun began that
//! lists the router not draining, its lease no older than the one we knew,
//! ends it ([`Choice::lift_returned`]): the router is back. (Leases are in
//! whole seconds: a router restarted within the second of its last lease
//! shows the same expiry, so "no older", not "newer".) A router whose last
//! lease, saying DRAINING, never reached the control plane also looks
//! back: it is tried once, and if it refuses again (or is gone, and its
//! redials run out) a second lift needs a lease renewed since, so a stale
//! entry costs each member one more try, not one per fetch. A router
//! restarted under a new PeerId needs nothing of the kind: it is a new
//! candidate, while its old entry stays draining until its lease ends.

use std::collections::{BTreeMap, HashMap, HashSet};

use libp2p::PeerId;
use tokio::time::Instant;

use crate::select::{Candidate, matches_selector};

use super::redial::Redials;

/// What keeps routers out of the choice: shuns, failures in a row (which
/// double the next shun) and connection-failure runs (see [`super::redial`]).
#[derive(Debug, Default)]
pub(crate) struct Choice {
    pub(crate) shunned: HashMap<PeerId, Shun>,
    /// Failures in a row per router (escalates shunning; cleared on a reservation).
    pub(crate) failures: HashMap<PeerId, u32>,
    /// Connection failures in a row per router (backoff; cleared on admission).
    pub(crate) redials: HashMap<PeerId, Redials>,
    /// "No router to attach to" was logged since the last directory fetch.
    pub(crate) warned_no_router: bool,
    /// A lost router is replaced from this instant on (while another
    /// serves; see [`crate::Config::router_replace_spread`]).
    pub(crate) replace_after: Option<Instant>,
    /// Routers whose leaving shun a directory ended since they last
    /// served us: ending another needs a lease renewed since.
    pub(crate) lifted: HashSet<PeerId>,
    /// A router has served us since start: holding none now is a rejoin
    /// (one router at a time until one serves, see
    /// [`crate::config::RoutersConfig::rejoin_spread`]), not a first start.
    pub(crate) held_before: bool,
    /// A router refused our credential as revoked at this instant: no
    /// other router is asked until a directory fetched since answers (the
    /// control plane's signed revocation list beside it settles whether we
    /// are revoked), for at most [`REVOCATION_CHECK_MAX`]. A revoked
    /// member so asks one router, not each in turn, and a router that lied
    /// costs a member one directory fetch.
    pub(crate) revocation_check: Option<Instant>,
}

/// Longest wait for the directory fetch that settles a router's "revoked"
/// (a fetch in a hurry gives up after 10 s).
pub(crate) const REVOCATION_CHECK_MAX: std::time::Duration = std::time::Duration::from_secs(12);

impl Choice {
    /// Routers to hold or acquire now out of `k`, with `reserved` serving
    /// us: one while a node that had held a router holds none (a rejoin),
    /// else `k`.
    pub(crate) fn routers_wanted(&self, k: usize, reserved: usize) -> usize {
        if self.held_before && reserved == 0 {
            k.min(1)
        } else {
            k
        }
    }

    /// After a directory fetch: forgets the failures of routers it no
    /// longer lists, and may warn again.
    pub(crate) fn forget_unknown(&mut self, known: &HashSet<PeerId>) {
        self.failures.retain(|p, _| known.contains(p));
        self.redials.retain(|p, _| known.contains(p));
        self.lifted.retain(|p| known.contains(p));
        self.warned_no_router = false;
    }

    /// Ends the shuns that are over at `now`.
    pub(crate) fn expire(&mut self, now: Instant) {
        self.shunned.retain(|_, s| s.until > now);
    }

    /// Whether a router's "revoked" still waits for the directory fetch
    /// that settles it at `now`; a check past [`REVOCATION_CHECK_MAX`] ends.
    pub(crate) fn checking_revocation(&mut self, now: Instant) -> bool {
        match self.revocation_check {
            Some(since) if now.saturating_duration_since(since) < REVOCATION_CHECK_MAX => true,
            Some(_) => {
                self.revocation_check = None;
                false
            }
            None => false,
        }
    }

    /// A directory fetch that started at `fetched_at` ended (taken or
    /// failed): it settles a check that began before it.
    pub(crate) fn revocation_settled(&mut self, fetched_at: Instant) {
        if self
            .revocation_check
            .is_some_and(|since| fetched_at >= since)
        {
            self.revocation_check = None;
        }
    }

    /// The node holds a new credential: routers that refused the old one
    /// as revoked may judge this one (a router that lied or erred about
    /// the revocation is back in the choice; one that was right refuses
    /// again, once per credential). Returns how many were lifted.
    pub(crate) fn new_credential(&mut self) -> usize {
        self.revocation_check = None;
        let before = self.shunned.len();
        self.shunned.retain(|_, s| !s.until_new_credential);
        before - self.shunned.len()
    }
}

/// Why and how long a router is kept out of the choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shun {
    /// The shun ends (doubled for failures in a row, jittered).
    pub(crate) until: Instant,
    /// When the node is short of K, it may try the router again from here
    /// (the base wait without the doubling, jittered; `until` at most).
    pub(crate) early: Instant,
    /// The router is leaving (it said DRAINING): never tried early.
    pub(crate) draining: bool,
    /// The router refused our credential as revoked: never tried early,
    /// and tried again at once when the credential changes.
    pub(crate) until_new_credential: bool,
    /// When the shun began.
    pub(crate) since: Instant,
    /// The router's lease expiry in our directory when the shun began
    /// (0: not known): a later one shows it renewed its lease since.
    pub(crate) lease_seen: i64,
}

impl Choice {
    /// After a directory fetch that started at `fetched_at`: ends the
    /// shuns of leaving routers (`draining`) that `listed` shows back: not
    /// draining, with a lease no older than the one we knew (renewed
    /// since, for a router lifted before and not served by since), in a
    /// fetch that began after the shun did (an answer under way when the
    /// go-away came may predate it). Shuns for failures (they end early
    /// by themselves when the node is short) and for a revoked credential
    /// stay. Returns the routers lifted.
    pub(crate) fn lift_returned(
        &mut self,
        listed: &[Candidate],
        fetched_at: Instant,
    ) -> Vec<PeerId> {
        let back: HashMap<PeerId, i64> = listed
            .iter()
            .filter(|c| !c.draining && c.lease_expires_at_unix_secs > 0)
            .map(|c| (c.peer, c.lease_expires_at_unix_secs))
            .collect();
        let mut lifted: Vec<PeerId> = self
            .shunned
            .iter()
            .filter(|(p, s)| {
                s.draining
                    && !s.until_new_credential
                    && s.since < fetched_at
                    && back.get(p).is_some_and(|lease| {
                        *lease > s.lease_seen
                            || (*lease == s.lease_seen && !self.lifted.contains(p))
                    })
            })
            .map(|(p, _)| *p)
            .collect();
        lifted.sort();
        for p in &lifted {
            self.shunned.remove(p);
            // Its failures were the leaving, not a fault: start afresh.
            self.failures.remove(p);
            self.lifted.insert(*p);
        }
        lifted
    }
}

/// Shunned routers worth trying anyway because fewer than `n` free
/// candidates exist: matching `selector`, not in `held`, not draining (per
/// the directory or a go-away), past their early time; soonest-ending
/// shun first, at most `n`.
pub(crate) fn fallbacks(
    candidates: &[Candidate],
    selector: &BTreeMap<String, String>,
    held: &HashSet<PeerId>,
    shunned: &HashMap<PeerId, Shun>,
    now: Instant,
    n: usize,
) -> Vec<Candidate> {
    let mut eligible: Vec<(Instant, &Candidate)> = candidates
        .iter()
        .filter(|c| matches_selector(c, selector) && !held.contains(&c.peer))
        .filter_map(|c| {
            let s = shunned.get(&c.peer)?;
            (!s.draining && !s.until_new_credential && s.early <= now).then_some((s.until, c))
        })
        .collect();
    eligible.sort_by_key(|(until, _)| *until);
    eligible
        .into_iter()
        .take(n)
        .map(|(_, c)| c.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_node_back_from_holding_no_router_wants_one_at_a_time_and_a_first_start_k() {
        let mut c = Choice::default();
        assert_eq!(c.routers_wanted(2, 0), 2, "first start: K at once");
        c.held_before = true;
        assert_eq!(c.routers_wanted(2, 0), 1, "rejoin: one until it serves");
        assert_eq!(c.routers_wanted(2, 1), 2, "one serves: K again");
        assert_eq!(c.routers_wanted(1, 0), 1);
        assert_eq!(c.routers_wanted(3, 2), 3);
    }

    fn cand() -> Candidate {
        Candidate {
            peer: PeerId::random(),
            addrs: vec!["/ip4/127.0.0.1/tcp/1".parse().expect("addr")],
            labels: Default::default(),
            load: 0.0,
            draining: false,
            lease_expires_at_unix_secs: 0,
        }
    }

    fn shun(now: Instant, until_s: u64, early_s: i64, draining: bool) -> Shun {
        let early = if early_s >= 0 {
            now + Duration::from_secs(early_s as u64)
        } else {
            now - Duration::from_secs((-early_s) as u64)
        };
        Shun {
            until: now + Duration::from_secs(until_s),
            early,
            draining,
            until_new_credential: false,
            since: now,
            lease_seen: 0,
        }
    }

    #[test]
    fn short_of_k_tries_the_shun_ending_soonest_but_never_a_draining_router() {
        let now = Instant::now();
        let (a, b, c, d, e, held) = (cand(), cand(), cand(), cand(), cand(), cand());
        let mut in_dir = cand();
        in_dir.draining = true;
        let shunned: HashMap<PeerId, Shun> = [
            // Doubled to 160 s, but its base (10 s) has passed.
            (a.peer, shun(now, 160, -1, false)),
            // Ends soonest of the eligible ones.
            (b.peer, shun(now, 40, -5, false)),
            // Told us DRAINING: ends soonest of all, still never tried.
            (c.peer, shun(now, 5, -30, true)),
            // Base not over yet (e.g. just failed again).
            (d.peer, shun(now, 20, 3, false)),
            (in_dir.peer, shun(now, 1, -1, false)),
            (held.peer, shun(now, 1, -1, false)),
        ]
        .into();
        let all = vec![
            a.clone(),
            b.clone(),
            c.clone(),
            d.clone(),
            e.clone(),
            in_dir.clone(),
            held.clone(),
        ];
        let held_set: HashSet<PeerId> = [held.peer].into();
        let sel = BTreeMap::new();
        let peers = |v: Vec<Candidate>| v.into_iter().map(|c| c.peer).collect::<Vec<_>>();
        // One slot short: the soonest-ending eligible shun.
        assert_eq!(
            peers(fallbacks(&all, &sel, &held_set, &shunned, now, 1)),
            vec![b.peer]
        );
        // More slots than eligible routers: both eligible ones, soonest first;
        // not the draining one, not the one still in its base wait, not the
        // directory's draining one, not a held one, not an unshunned one
        // (those are the normal choice's business).
        assert_eq!(
            peers(fallbacks(&all, &sel, &held_set, &shunned, now, 5)),
            vec![b.peer, a.peer]
        );
        // Once the base wait of `d` passes, it is eligible too (ends before `a`).
        let later = now + Duration::from_secs(4);
        assert_eq!(
            peers(fallbacks(&all, &sel, &held_set, &shunned, later, 5)),
            vec![d.peer, b.peer, a.peer]
        );
        // The selector still applies.
        let sel: BTreeMap<String, String> = [("zone".to_string(), "x".to_string())].into();
        assert!(fallbacks(&all, &sel, &held_set, &shunned, now, 5).is_empty());
        let _ = e;
    }

    #[test]
    fn a_leaving_router_back_in_a_later_directory_is_tried_again_at_once() {
        let t0 = Instant::now();
        let listed = |c: &Candidate, draining: bool, lease: i64| Candidate {
            draining,
            lease_expires_at_unix_secs: lease,
            ..c.clone()
        };
        let (left, dead, stale, failed, revoked, moved) =
            (cand(), cand(), cand(), cand(), cand(), cand());
        let mut choice = Choice::default();
        let leaving = |lease_seen| Shun {
            lease_seen,
            ..shun(t0, 300, 300, true)
        };
        // Each sent go-away DRAINING when its lease in our directory ran to 1000.
        for c in [&left, &dead, &stale] {
            choice.shunned.insert(c.peer, leaving(1000));
            choice.failures.insert(c.peer, 1);
        }
        choice.shunned.insert(failed.peer, shun(t0, 40, 10, false));
        choice.shunned.insert(
            revoked.peer,
            Shun {
                until_new_credential: true,
                ..leaving(1000)
            },
        );
        // Restarted under a new PeerId: its old entry stays draining.
        choice.shunned.insert(moved.peer, leaving(1000));
        let dir = vec![
            // Restarted with its key: not draining, lease renewed (1060).
            listed(&left, false, 1060),
            // Killed after its last lease said draining: stays draining.
            listed(&dead, true, 1030),
            // Its last (draining) lease never reached the control plane:
            // not draining, nothing renewed since we shunned it (or it
            // restarted within the second of that lease).
            listed(&stale, false, 1000),
            listed(&failed, false, 1060),
            listed(&revoked, false, 1060),
            listed(&moved, true, 1030),
        ];
        // An answer to a fetch that began before the go-away proves nothing.
        let before = t0 - Duration::from_millis(1);
        assert!(choice.lift_returned(&dir, before).is_empty());
        // A fetch begun after it: only the router that is back.
        let after = t0 + Duration::from_secs(2);
        let mut both = vec![left.peer, stale.peer];
        both.sort();
        assert_eq!(choice.lift_returned(&dir, after), both);
        assert!(!choice.shunned.contains_key(&left.peer));
        assert!(!choice.failures.contains_key(&left.peer), "starts afresh");
        for p in [dead.peer, failed.peer, revoked.peer, moved.peer] {
            assert!(choice.shunned.contains_key(&p));
        }
        // The stale one refused us again as draining (or was gone): the
        // same entry does not lift it a second time, a renewed lease does.
        choice.shunned.insert(stale.peer, leaving(1000));
        assert!(choice.lift_returned(&dir, after).is_empty());
        assert_eq!(
            choice.lift_returned(&[listed(&stale, false, 1015)], after),
            vec![stale.peer]
        );
        // Once it serves us again (`lifted` cleared), the next leaving
        // starts over.
        choice.lifted.remove(&stale.peer);
        choice.shunned.insert(stale.peer, leaving(1015));
        assert_eq!(
            choice.lift_returned(&[listed(&stale, false, 1015)], after),
            vec![stale.peer]
        );
        // Not listed at all (its lease ended): stays shunned.
        assert!(choice.lift_returned(&[], after).is_empty());
        // A shun with no lease seen (a go-away alternative we never saw in
        // the directory) ends once a listing shows it up.
        let alt = cand();
        choice.shunned.insert(alt.peer, leaving(0));
        assert_eq!(
            choice.lift_returned(&[listed(&alt, false, 50)], after),
            vec![alt.peer]
        );
    }

    #[test]
    fn a_router_that_refused_us_as_revoked_waits_for_a_new_credential() {
        let now = Instant::now();
        let (revoked, failed) = (cand(), cand());
        let mut choice = Choice::default();
        choice.shunned.insert(
            revoked.peer,
            Shun {
                until_new_credential: true,
                ..shun(now, 1800, -1, false)
            },
        );
        choice.shunned.insert(failed.peer, shun(now, 40, -1, false));
        let all = vec![revoked.clone(), failed.clone()];
        let sel = BTreeMap::new();
        let none = HashSet::new();
        // Short of K and past its base wait: still not asked again.
        let tried = fallbacks(&all, &sel, &none, &choice.shunned, now, 2);
        assert_eq!(
            tried.iter().map(|c| c.peer).collect::<Vec<_>>(),
            vec![failed.peer]
        );
        // A new credential lifts that shun alone.
        assert_eq!(choice.new_credential(), 1);
        assert!(!choice.shunned.contains_key(&revoked.peer));
        assert!(choice.shunned.contains_key(&failed.peer));
        assert_eq!(choice.new_credential(), 0);
    }

    /// A router's "revoked" holds every other router back until a
    /// directory fetched since it answers, or for at most
    /// [`REVOCATION_CHECK_MAX`]; a fetch that began before it settles
    /// nothing, and a new credential ends the check.
    #[test]
    fn a_routers_revoked_waits_for_a_directory_fetched_since() {
        let now = Instant::now();
        let mut choice = Choice::default();
        assert!(!choice.checking_revocation(now));
        choice.revocation_check = Some(now);
        assert!(choice.checking_revocation(now + Duration::from_secs(5)));
        // A fetch that began a moment before the refusal: not settled.
        choice.revocation_settled(now - Duration::from_millis(1));
        assert!(choice.checking_revocation(now + Duration::from_secs(1)));
        // One that began since: settled.
        choice.revocation_settled(now);
        assert!(!choice.checking_revocation(now + Duration::from_secs(1)));
        // Unanswered, the check ends on its own.
        choice.revocation_check = Some(now);
        assert!(!choice.checking_revocation(now + REVOCATION_CHECK_MAX));
        assert_eq!(choice.revocation_check, None);
        // A new credential ends it too.
        choice.revocation_check = Some(now);
        choice.new_credential();
        assert!(!choice.checking_revocation(now));
    }
}
