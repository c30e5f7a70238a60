//! Admission: who is admitted, for what, until when, and every rule that
//! decides it.
//!
//! - this file: the table of admitted peers. The swarm loop owns it
//!   (`crate::tables`): it admits when the auth server asks (after a
//!   credential verifies, through the gate), regroups when the policy asks,
//!   and drops peers on disconnect, expiry and revocation. Everyone else
//!   reads it through `Admissions`, a view: the relay ACL on every
//!   reservation and circuit request, the resource manager on every stream;
//! - `gate`: the drain and high-watermark gate in front of a new admission;
//! - `conns`: the swarm loop's connections as admission sees them, and the
//!   auth-deadline sweep over them;
//! - `groups`: an admitted peer's claims and policy groups.
//!
//! Pure data and policy: callers pass `now` and act on the answers.

pub(crate) mod conns;
pub(crate) mod gate;
pub mod groups;

use std::collections::HashMap;

use agentmesh_policy::Policy;
use agentmesh_proto::credential::Trust;
use libp2p::PeerId;

use crate::owned::View;
use crate::shrink::ShrinkSparse;
pub use groups::PeerGroups;

/// The admission table as every task but its owner (the swarm loop) sees
/// it: read-only.
pub(crate) type Admissions = View<AdmissionTable>;

/// The resource manager counts a peer's charges as a member's while the
/// table lists it (expired or not: the swarm loop's sweep removes it).
impl crate::resources::AdmittedPeers for Admissions {
    fn is_admitted(&self, peer: &PeerId) -> bool {
        self.read().get(peer).is_some()
    }
}

/// What a peer was admitted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Purpose {
    /// A member attaching: counted, may reserve and publish.
    Attach,
    /// A member (or router) passing through: may open circuits only.
    Transit,
    /// A router in the router mesh.
    Router,
}

impl Purpose {
    /// Every purpose, to pre-create metric labels.
    pub const ALL: [Purpose; 3] = [Purpose::Attach, Purpose::Transit, Purpose::Router];

    /// A stable metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Attach => "attach",
            Self::Transit => "transit",
            Self::Router => "router",
        }
    }
}

/// One admitted peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// What it was admitted for (the latest auth wins).
    pub purpose: Purpose,
    /// Admission ends when the credential expires (Unix seconds).
    pub until: i64,
    /// The node id from its credential.
    pub node_id: String,
    /// Other routers the member said it is attached to (for trimming).
    pub attached_routers: Vec<PeerId>,
    /// Its verified claims and policy groups (`None`: admitted without
    /// claims, as in tests; such a peer is in no group).
    pub groups: Option<PeerGroups>,
    /// How this router pushes the policy to it (members only).
    pub push: PushRole,
}

/// Which of a member's routers this one is for policy pushes, as the
/// member said at attach (`AuthRequest.policy_push_slot`). The member is
/// the only one a wrong answer hurts: routers enforce the policy on
/// everything they relay whatever the member holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PushSlot {
    /// A member that predates the field: pushed at once, as before.
    #[default]
    Unspecified,
    /// Pushed at once.
    Primary,
    /// Probed after `--policy-push-fallback-delay-ms`; sent the policy
    /// only if it still lacks it.
    Fallback,
}

/// What the push needs to know about one admitted member.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushRole {
    /// The member's slot.
    pub slot: PushSlot,
    /// The router's state generation the member is known to hold in full
    /// (policy and revocations): set when the admission answer carried it,
    /// so a round for that generation skips the member.
    pub holds_generation: Option<u64>,
}

/// Counts by purpose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Admitted with purpose attach.
    pub attached: u32,
    /// Admitted with purpose transit.
    pub transit: u32,
    /// Admitted routers.
    pub routers: u32,
}

/// The admitted peers.
#[derive(Debug, Default)]
pub struct AdmissionTable {
    peers: HashMap<PeerId, Admission>,
    /// `peers` by purpose, kept in step with every change: the gate asks
    /// for it on each new member's admission, in the swarm loop.
    counts: Counts,
}

impl Counts {
    fn slot(&mut self, purpose: Purpose) -> &mut u32 {
        match purpose {
            Purpose::Attach => &mut self.attached,
            Purpose::Transit => &mut self.transit,
            Purpose::Router => &mut self.routers,
        }
    }

    fn add(&mut self, purpose: Purpose) {
        *self.slot(purpose) += 1;
    }

    fn sub(&mut self, purpose: Purpose) {
        let n = self.slot(purpose);
        *n = n.saturating_sub(1);
    }
}

/// Whether `trust` lists `peer`'s admission `a` as revoked, by PeerId or
/// by the token its credential was enrolled with.
pub fn is_revoked(peer: &PeerId, a: &Admission, trust: &Trust, now: i64) -> bool {
    trust.is_revoked(peer, now)
        || a.groups
            .as_ref()
            .is_some_and(|g| trust.is_claims_revoked(g.claims(), now))
}

impl AdmissionTable {
    /// Records (or replaces) `peer`'s admission; returns the previous one.
    pub fn admit(&mut self, peer: PeerId, admission: Admission) -> Option<Admission> {
        self.counts.add(admission.purpose);
        let previous = self.peers.insert(peer, admission);
        if let Some(p) = &previous {
            self.counts.sub(p.purpose);
        }
        previous
    }

    /// The admission of `peer`, if any.
    pub fn get(&self, peer: &PeerId) -> Option<&Admission> {
        self.peers.get(peer)
    }

    /// Forgets `peer`; returns what it was admitted for.
    pub fn remove(&mut self, peer: &PeerId) -> Option<Admission> {
        let gone = self.peers.remove(peer);
        if let Some(a) = &gone {
            self.counts.sub(a.purpose);
        }
        self.peers.shrink_sparse();
        gone
    }

    /// Notes that `peer` now holds state generation `generation` in full
    /// (its admission answer carried it).
    pub fn note_holds(&mut self, peer: &PeerId, generation: u64) {
        if let Some(a) = self.peers.get_mut(peer) {
            a.push.holds_generation = Some(generation);
        }
    }

    /// Whether `peer` is admitted (for anything) at `now`.
    pub fn is_admitted(&self, peer: &PeerId, now: i64) -> bool {
        self.peers.get(peer).is_some_and(|a| a.until >= now)
    }

    /// Whether `peer` may hold a relay reservation: admitted to attach.
    pub fn may_reserve(&self, peer: &PeerId, now: i64) -> bool {
        self.peers
            .get(peer)
            .is_some_and(|a| a.purpose == Purpose::Attach && a.until >= now)
    }

    /// Whether `peer` may open a circuit: admitted for any purpose.
    pub fn may_open_circuit(&self, peer: &PeerId, now: i64) -> bool {
        self.is_admitted(peer, now)
    }

    /// Whether `peer` is an admitted router.
    pub fn is_router(&self, peer: &PeerId, now: i64) -> bool {
        self.peers
            .get(peer)
            .is_some_and(|a| a.purpose == Purpose::Router && a.until >= now)
    }

    /// Removes and returns peers whose admission ended before `now - skew`.
    pub fn expire(&mut self, now: i64, skew_secs: i64) -> Vec<PeerId> {
        let gone: Vec<PeerId> = self
            .peers
            .iter()
            .filter(|(_, a)| a.until.saturating_add(skew_secs) < now)
            .map(|(p, _)| *p)
            .collect();
        for p in &gone {
            self.remove(p);
        }
        gone
    }

    /// Removes and returns admitted peers that `trust` lists as revoked,
    /// by PeerId or by the token their credential was enrolled with.
    pub fn revoke(&mut self, trust: &Trust, now: i64) -> Vec<PeerId> {
        let gone: Vec<PeerId> = self
            .peers
            .iter()
            .filter(|(p, a)| is_revoked(p, a, trust, now))
            .map(|(p, _)| *p)
            .collect();
        for p in &gone {
            self.remove(p);
        }
        gone
    }

    /// Peers in the table (admitted or expired, not yet removed).
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// Whether no peer is in the table.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Admitted peers by purpose.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Every admitted peer with its admission.
    pub fn iter(&self) -> impl Iterator<Item = (&PeerId, &Admission)> {
        self.peers.iter()
    }

    /// Recomputes every admitted peer's groups under `policy` (just applied).
    pub fn regroup(&mut self, policy: &std::sync::Arc<Policy>) {
        for a in self.peers.values_mut() {
            if let Some(g) = a.groups.as_mut() {
                g.regroup(policy);
            }
        }
    }

    /// Whether `policy` lets a circuit run from `from` to `to`: both
    /// admitted with claims, and `from` granted some service `to` owns.
    pub fn may_reach(&self, from: &PeerId, to: &PeerId, policy: &std::sync::Arc<Policy>) -> bool {
        let groups = |p: &PeerId| self.peers.get(p).and_then(|a| a.groups.as_ref());
        match (groups(from), groups(to)) {
            (Some(f), Some(t)) => policy.may_reach(&f.under(policy), &t.under(policy)),
            _ => false,
        }
    }

    /// Admitted routers.
    pub fn routers(&self) -> impl Iterator<Item = &PeerId> {
        self.peers
            .iter()
            .filter(|(_, a)| a.purpose == Purpose::Router)
            .map(|(p, _)| p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentmesh_proto::pb::credential::{KeySet, Revocation};

    fn adm(purpose: Purpose, until: i64) -> Admission {
        Admission {
            purpose,
            until,
            node_id: "n".into(),
            attached_routers: vec![],
            groups: None,
            push: PushRole::default(),
        }
    }

    #[test]
    fn rights_follow_purpose() {
        let mut t = AdmissionTable::default();
        let (a, b, r, x) = (
            PeerId::random(),
            PeerId::random(),
            PeerId::random(),
            PeerId::random(),
        );
        t.admit(a, adm(Purpose::Attach, 100));
        t.admit(b, adm(Purpose::Transit, 100));
        t.admit(r, adm(Purpose::Router, 100));
        assert!(t.may_reserve(&a, 50));
        assert!(!t.may_reserve(&b, 50), "transit may not reserve");
        assert!(!t.may_reserve(&r, 50));
        assert!(!t.may_reserve(&x, 50), "unknown may not reserve");
        assert!(t.may_open_circuit(&a, 50) && t.may_open_circuit(&b, 50));
        assert!(!t.may_open_circuit(&x, 50));
        assert!(
            !t.may_reserve(&a, 101),
            "admission ends with the credential"
        );
        assert!(t.is_router(&r, 50) && !t.is_router(&a, 50));
        assert_eq!(
            t.counts(),
            Counts {
                attached: 1,
                transit: 1,
                routers: 1
            }
        );
    }

    #[test]
    fn counts_stay_equal_to_a_recount_through_every_change() {
        let recount = |t: &AdmissionTable| {
            let mut c = Counts::default();
            for (_, a) in t.iter() {
                c.add(a.purpose);
            }
            c
        };
        let mut t = AdmissionTable::default();
        let peers: Vec<PeerId> = (0..6).map(|_| PeerId::random()).collect();
        let purposes = [Purpose::Attach, Purpose::Transit, Purpose::Router];
        for (i, p) in peers.iter().enumerate() {
            t.admit(*p, adm(purposes[i % 3], 100 + i as i64));
            assert_eq!(t.counts(), recount(&t));
        }
        // A re-presentation with another purpose moves the peer's count.
        t.admit(peers[0], adm(Purpose::Transit, 300));
        assert_eq!(t.counts(), recount(&t));
        t.remove(&peers[1]);
        t.remove(&peers[1]);
        assert_eq!(t.counts(), recount(&t));
        assert_eq!(t.expire(103, 0), vec![peers[2]], "until 102 ended");
        assert_eq!(t.counts(), recount(&t));
        let mut trust = Trust::new(&KeySet::default());
        trust.set_revocations(&[Revocation {
            peer_id: peers[5].to_bytes(),
            until_unix_secs: 500,
            reason: "test".into(),
            token_id: String::new(),
        }]);
        assert_eq!(t.revoke(&trust, 50), vec![peers[5]]);
        assert_eq!(t.counts(), recount(&t));
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn latest_auth_wins() {
        let mut t = AdmissionTable::default();
        let a = PeerId::random();
        t.admit(a, adm(Purpose::Transit, 100));
        let prev = t.admit(a, adm(Purpose::Attach, 200));
        assert_eq!(prev.map(|p| p.purpose), Some(Purpose::Transit));
        assert!(t.may_reserve(&a, 150));
    }

    #[test]
    fn expiry_honours_skew() {
        let mut t = AdmissionTable::default();
        let a = PeerId::random();
        t.admit(a, adm(Purpose::Attach, 100));
        assert!(t.expire(150, 60).is_empty());
        assert_eq!(t.expire(161, 60), vec![a]);
        assert!(t.get(&a).is_none());
    }

    #[test]
    fn revocation_drops_only_revoked_peers() {
        let mut t = AdmissionTable::default();
        let (a, b) = (PeerId::random(), PeerId::random());
        t.admit(a, adm(Purpose::Attach, 100));
        t.admit(b, adm(Purpose::Attach, 100));
        let mut trust = Trust::new(&KeySet::default());
        trust.set_revocations(&[Revocation {
            peer_id: a.to_bytes(),
            until_unix_secs: 500,
            reason: "test".into(),
            token_id: String::new(),
        }]);
        assert_eq!(t.revoke(&trust, 50), vec![a]);
        assert!(t.get(&b).is_some());
        assert!(t.revoke(&trust, 50).is_empty());
    }
}
