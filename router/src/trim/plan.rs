//! The trimming plan (pure): at the high watermark, which admitted members
//! to shed so the router is back at the low watermark (about 15% of its
//! members, never more).
//!
//! Order: unauthenticated connections are closed first (they hold no member
//! and cost memory; the caller closes all of them); then members that
//! reported other routers on admission (`AuthRequest.attached_routers`),
//! those with the most other routers first; then, only if still above the
//! low watermark, members that reported no other router (they get go-away
//! with alternatives and move make-before-break, so they lose nothing but
//! a short detour). Peer routers and transit peers are never trimmed: they
//! are not counted by the watermarks.

use libp2p::PeerId;

use crate::admission::Purpose;

/// Why a connection was shed (the `reason` label of `agentmesh_router_trimmed_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum TrimReason {
    /// A connection whose peer was not admitted.
    Unauthenticated,
    /// A member that holds other routers.
    OtherRouters,
    /// A member that reported no other router.
    OnlyRouter,
}

/// Every trim reason, to pre-create metric labels.
pub(crate) const REASONS: [TrimReason; 3] = [
    TrimReason::Unauthenticated,
    TrimReason::OtherRouters,
    TrimReason::OnlyRouter,
];

impl TrimReason {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Unauthenticated => "unauthenticated",
            Self::OtherRouters => "other_routers",
            Self::OnlyRouter => "only_router",
        }
    }
}

/// One admitted peer as trimming sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The peer.
    pub(crate) peer: PeerId,
    /// What it was admitted for (only `Attach` counts and may be shed).
    pub(crate) purpose: Purpose,
    /// Routers other than this one the member reported holding.
    pub(crate) other_routers: usize,
}

/// Members to shed, in order, with the reason of each.
///
/// Sheds `attached - low` members once `high` or more are attached
/// (`attached` counts `Attach` candidates), else none: a router that reaches
/// its high watermark (where admission turns into go-away) makes room down to
/// the low one. With `low == high` nothing is shed at the high watermark.
pub(crate) fn plan(candidates: &[Candidate], high: u32, low: u32) -> Vec<(PeerId, TrimReason)> {
    let mut members: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.purpose == Purpose::Attach)
        .collect();
    let attached = members.len();
    let (high, low) = (high as usize, (low.min(high)) as usize);
    if attached < high || attached <= low {
        return Vec::new();
    }
    let excess = attached - low;
    // Most other routers first; the peer id breaks ties so the plan is stable.
    members.sort_by(|a, b| {
        b.other_routers
            .cmp(&a.other_routers)
            .then_with(|| a.peer.to_bytes().cmp(&b.peer.to_bytes()))
    });
    members
        .into_iter()
        .take(excess)
        .map(|c| {
            let reason = if c.other_routers > 0 {
                TrimReason::OtherRouters
            } else {
                TrimReason::OnlyRouter
            };
            (c.peer, reason)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;

    fn purpose() -> impl Strategy<Value = Purpose> {
        prop_oneof![
            6 => Just(Purpose::Attach),
            1 => Just(Purpose::Transit),
            1 => Just(Purpose::Router),
        ]
    }

    fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
        prop::collection::vec((purpose(), 0usize..4), 0..300).prop_map(|v| {
            v.into_iter()
                .map(|(purpose, other_routers)| Candidate {
                    peer: PeerId::random(),
                    purpose,
                    other_routers,
                })
                .collect()
        })
    }

    #[test]
    fn sheds_down_to_low_from_high_and_above() {
        let c: Vec<Candidate> = (0..101)
            .map(|i| Candidate {
                peer: PeerId::random(),
                purpose: Purpose::Attach,
                other_routers: i % 2,
            })
            .collect();
        let p = plan(&c, 100, 85);
        assert_eq!(p.len(), 16, "101 members down to 85");
        assert!(p.iter().all(|(_, r)| *r == TrimReason::OtherRouters));
        assert_eq!(plan(&c[..100], 100, 85).len(), 15, "at high: down to low");
        assert!(plan(&c[..99], 100, 85).is_empty(), "below high: nothing");
        assert!(
            plan(&c[..100], 100, 100).is_empty(),
            "low == high: nothing shed at high"
        );
    }

    proptest! {
        #[test]
        fn plan_sheds_down_to_low_members_only_multi_homed_first(
            c in candidates(),
            high in 0u32..250,
            pct in 0u32..=30,
        ) {
            let low = high * (100 - pct) / 100;
            let p = plan(&c, high, low);
            let attached = c.iter().filter(|x| x.purpose == Purpose::Attach).count();
            // Exactly down to low when above high; nothing otherwise.
            if attached >= high as usize && attached > low as usize {
                prop_assert_eq!(p.len(), attached - low as usize);
            } else {
                prop_assert!(p.is_empty());
            }
            // No peer twice; only members (never routers or transit).
            let shed: HashSet<PeerId> = p.iter().map(|(x, _)| *x).collect();
            prop_assert_eq!(shed.len(), p.len());
            for x in &c {
                if shed.contains(&x.peer) {
                    prop_assert_eq!(x.purpose, Purpose::Attach);
                }
            }
            // Members with other routers go before any member without.
            let first_only = p.iter().position(|(_, r)| *r == TrimReason::OnlyRouter);
            if let Some(i) = first_only {
                prop_assert!(p[i..].iter().all(|(_, r)| *r == TrimReason::OnlyRouter));
                let multi_kept = c.iter().any(|x| {
                    x.purpose == Purpose::Attach && x.other_routers > 0 && !shed.contains(&x.peer)
                });
                prop_assert!(!multi_kept, "a single-homed member shed while a multi-homed one stays");
            }
            // Reasons match what the member reported.
            for (peer, r) in &p {
                let x = c.iter().find(|x| x.peer == *peer).expect("shed peer is a candidate");
                prop_assert_eq!(*r == TrimReason::OtherRouters, x.other_routers > 0);
            }
        }
    }
}
