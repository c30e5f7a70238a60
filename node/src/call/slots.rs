//! The slots of accepted inbound calls: `--max-inbound-calls` of them,
//! shared by the callers' **enrollment tokens**, and at most
//! `--max-inbound-calls-per-caller` for one caller PeerId.
//!
//! Why tokens: a token that may be used N times mints N identities, each
//! with a per-caller cap of its own, so per-PeerId limits let one token
//! take every slot (nine identities of one 10-use token held all 256).
//! Why not a fixed cap per token: a fleet enrolls with one bootstrap token
//! (thousands of members), and must not be held to a sliver of a
//! provider. So the share binds only under contention, with the project's
//! one scheme for held slots (`agentmesh_fair::FairSlots`, keyed by
//! token): while slots are free, one token may use them all; once all are
//! taken, a caller whose token holds fewer than the heaviest token (by two)
//! takes that token's least recently active call (the call's splice
//! [`CallSlot::touch`]es its slot as bytes move, so an idle call goes
//! before one moving bytes), and a caller whose token holds its share is
//! refused. A credential without a token id (issued before they existed)
//! counts as a token of its own, keyed by the caller's PeerId.
//!
//! Token ids are kept as 64-bit digests under a key drawn at start
//! (`RandomState`): `FairSlots` keys are small and copyable, and a token id
//! is chosen by the control plane, never by the caller, so nobody can aim
//! a collision at another token.

use std::collections::HashMap;
use std::hash::BuildHasher as _;
use std::hash::RandomState;

use agentmesh_fair::{FairSlots, Slot};
use agentmesh_proto::credential::VerifiedClaims;
use libp2p::PeerId;
use parking_lot::Mutex;

/// Whose share a call counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum CallerKey {
    /// The enrollment token (digest of its id).
    Token(u64),
    /// A caller whose credential names no token.
    Peer(PeerId),
}

/// Why a call got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoSlot {
    /// The caller PeerId holds `--max-inbound-calls-per-caller`.
    PerCaller {
        /// The cap.
        max: usize,
    },
    /// Every slot is taken and the caller's token holds its share.
    TokenShare {
        /// Slots its token holds.
        held: usize,
        /// Slots ÷ tokens holding any, for the refusal's detail.
        fair_share: usize,
    },
}

/// See the module doc.
pub(crate) struct CallSlots {
    slots: FairSlots<CallerKey>,
    per_caller: Mutex<HashMap<PeerId, usize>>,
    max_per_caller: usize,
    digest: RandomState,
}

impl CallSlots {
    /// `capacity` slots shared by token, `max_per_caller` per PeerId
    /// (both at least 1).
    pub(crate) fn new(capacity: usize, max_per_caller: usize) -> Self {
        Self {
            slots: FairSlots::keyed(capacity),
            per_caller: Mutex::new(HashMap::new()),
            max_per_caller: max_per_caller.max(1),
            digest: RandomState::new(),
        }
    }

    /// The key of a verified caller: its token, or its PeerId without one.
    pub(crate) fn key_of(&self, claims: &VerifiedClaims) -> CallerKey {
        self.key(&claims.claims.token_id, claims.peer)
    }

    fn key(&self, token_id: &str, peer: PeerId) -> CallerKey {
        if token_id.is_empty() {
            CallerKey::Peer(peer)
        } else {
            CallerKey::Token(self.digest.hash_one(token_id))
        }
    }

    /// A slot for a call of `peer` counted against `key`, or why not. The
    /// per-caller cap is checked first, so a caller at its cap never takes
    /// another token's call.
    pub(crate) fn try_acquire(&self, peer: PeerId, key: CallerKey) -> Result<CallSlot<'_>, NoSlot> {
        let mut per_caller = self.per_caller.lock();
        let mine = per_caller.get(&peer).copied().unwrap_or(0);
        if mine >= self.max_per_caller {
            return Err(NoSlot::PerCaller {
                max: self.max_per_caller,
            });
        }
        let granted = self
            .slots
            .try_acquire_key(key)
            .map_err(|r| NoSlot::TokenShare {
                held: r.held,
                fair_share: r.fair_share,
            })?;
        if let Some(from) = granted.preempted {
            tracing::debug!(%peer, ?key, ?from, "inbound call slot taken from a token holding more");
        }
        *per_caller.entry(peer).or_insert(0) += 1;
        Ok(CallSlot {
            owner: self,
            peer,
            slot: granted.slot,
        })
    }

    /// Calls `peer` holds now.
    #[cfg(test)]
    pub(crate) fn held_by_peer(&self, peer: &PeerId) -> usize {
        self.per_caller.lock().get(peer).copied().unwrap_or(0)
    }
}

/// One accepted call's slot; freed on drop.
pub(crate) struct CallSlot<'a> {
    owner: &'a CallSlots,
    peer: PeerId,
    slot: Slot<CallerKey>,
}

impl CallSlot<'_> {
    /// Completes once the slot was taken for a caller whose token holds
    /// fewer: end the call.
    pub(crate) async fn preempted(&self) {
        self.slot.revoked().await;
    }

    /// The call moved bytes (it is preempted after its token's idle calls).
    pub(crate) fn touch(&self) {
        self.slot.touch();
    }
}

impl Drop for CallSlot<'_> {
    fn drop(&mut self) {
        let mut m = self.owner.per_caller.lock();
        if let Some(n) = m.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(n: usize) -> Vec<PeerId> {
        (0..n).map(|_| PeerId::random()).collect()
    }

    /// Eight slots, four per caller. An attacker token's three identities
    /// take all eight while nobody else asks; a fleet member of another
    /// token then takes one of them, and the attacker's renewals are
    /// refused for its share; the per-caller cap still binds alone.
    #[test]
    fn one_tokens_identities_share_one_share_under_contention() {
        let slots = CallSlots::new(8, 4);
        let attacker = slots.key("attacker-token", PeerId::random());
        let fleet = slots.key("fleet-token", PeerId::random());
        assert_ne!(attacker, fleet);
        let ids = peers(3);
        let mut held = Vec::new();
        for (i, p) in ids.iter().enumerate() {
            for _ in 0..4 {
                match slots.try_acquire(*p, attacker) {
                    Ok(s) => held.push(s),
                    Err(e) => {
                        assert_eq!(i, 2, "only the third identity finds them taken");
                        assert_eq!(
                            e,
                            NoSlot::TokenShare {
                                held: 8,
                                fair_share: 8
                            }
                        );
                    }
                }
            }
        }
        assert_eq!(held.len(), 8, "no contention: one token may take all");
        assert_eq!(
            slots.try_acquire(ids[0], attacker).err(),
            Some(NoSlot::PerCaller { max: 4 }),
            "the per-caller cap is checked first"
        );
        let member = PeerId::random();
        let m1 = slots.try_acquire(member, fleet).expect("the fleet gets in");
        assert_eq!(held.iter().filter(|s| s.slot.is_revoked()).count(), 1);
        assert!(matches!(
            slots.try_acquire(ids[2], attacker),
            Err(NoSlot::TokenShare { held: 7, .. })
        ));
        // 7 against 1: the fleet keeps getting in until both hold 4.
        let m2 = slots.try_acquire(PeerId::random(), fleet).expect("2nd");
        let m3 = slots.try_acquire(PeerId::random(), fleet).expect("3rd");
        let m4 = slots.try_acquire(PeerId::random(), fleet).expect("4th");
        assert!(matches!(
            slots.try_acquire(PeerId::random(), fleet),
            Err(NoSlot::TokenShare { held: 4, .. })
        ));
        drop((m1, m2, m3, m4));
        held.retain(|s| !s.slot.is_revoked());
        assert_eq!(held.len(), 4);
    }

    #[test]
    fn a_fleet_on_one_token_may_use_every_slot_and_frees_per_caller_counts() {
        let slots = CallSlots::new(6, 32);
        let fleet = slots.key("fleet-token", PeerId::random());
        let members = peers(6);
        let held: Vec<_> = members
            .iter()
            .map(|p| slots.try_acquire(*p, fleet).expect("room"))
            .collect();
        assert!(held.iter().all(|s| !s.slot.is_revoked()));
        drop(held);
        assert!(members.iter().all(|p| slots.held_by_peer(p) == 0));
        assert!(slots.per_caller.lock().is_empty());
    }

    #[test]
    fn a_credential_without_a_token_counts_as_its_own_peer() {
        let slots = CallSlots::new(2, 2);
        let (a, b) = (PeerId::random(), PeerId::random());
        assert_eq!(slots.key("", a), CallerKey::Peer(a));
        assert_ne!(slots.key("", a), slots.key("", b));
        assert_eq!(slots.key("t", a), slots.key("t", b), "one token, one key");
    }

    /// Under contention the attacker loses an idle call before one that
    /// moves bytes.
    #[test]
    fn an_idle_call_is_preempted_before_a_busy_one() {
        let slots = CallSlots::new(3, 8);
        let (attacker, fleet) = (
            slots.key("a", PeerId::random()),
            slots.key("f", PeerId::random()),
        );
        let p = PeerId::random();
        let busy = slots.try_acquire(p, attacker).expect("1");
        let idle = slots.try_acquire(p, attacker).expect("2");
        let busy_too = slots.try_acquire(p, attacker).expect("3");
        busy.touch();
        busy_too.touch();
        let _m = slots.try_acquire(PeerId::random(), fleet).expect("fleet");
        assert!(idle.slot.is_revoked());
        assert!(!busy.slot.is_revoked() && !busy_too.slot.is_revoked());
        assert_eq!(slots.held_by_peer(&p), 3, "counted until the call ends");
        drop(idle);
        assert_eq!(slots.held_by_peer(&p), 2);
    }
}
