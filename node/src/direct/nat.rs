//! What the routers observed of this member, and the NAT kind that
//! follows. Pure: the engine owns one [`Observed`] (its one writer) and
//! feeds it each admission's observed address.
//!
//! Two routers that see the same public port for our one listening port
//! mean an endpoint-independent mapping: a punch leaving from that port
//! shows the peer the same port, so it can land. Different ports mean the
//! NAT picks a port per destination (endpoint-dependent, "symmetric"): the
//! port the peer would aim at is not the one our punch leaves from, so no
//! punch is tried. One observation says nothing either way: punches are
//! tried and may fail (counted).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use libp2p::PeerId;

/// The NAT kind the observations show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum NatKind {
    /// No router has told us what it observed yet.
    #[default]
    Unknown,
    /// One router has: a punch is tried, the kind is not known.
    Single,
    /// At least two routers saw one public address and port.
    EndpointIndependent,
    /// Routers saw different public ports (or addresses): no punch.
    EndpointDependent,
}

impl NatKind {
    /// Its name in `status` and logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::Single => "one_observation",
            Self::EndpointIndependent => "endpoint_independent",
            Self::EndpointDependent => "endpoint_dependent",
        }
    }

    /// Whether a punch may be tried.
    pub(crate) fn may_punch(self) -> bool {
        matches!(self, Self::Single | Self::EndpointIndependent)
    }
}

/// Most routers whose observation is kept (members hold a few).
const MAX_OBSERVERS: usize = 16;

/// Each router's observation of our listening port's mapping.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Observed {
    by_router: BTreeMap<PeerId, SocketAddr>,
}

impl Observed {
    /// `router` observed us at `addr`. Returns whether anything changed.
    /// Past [`MAX_OBSERVERS`] routers a new one is not kept.
    pub(crate) fn set(&mut self, router: PeerId, addr: SocketAddr) -> bool {
        if self.by_router.len() >= MAX_OBSERVERS && !self.by_router.contains_key(&router) {
            return false;
        }
        self.by_router.insert(router, addr) != Some(addr)
    }

    /// `router`'s observation no longer holds (it is gone, or our
    /// connection to it left from another port). Returns whether one was
    /// kept.
    pub(crate) fn remove(&mut self, router: &PeerId) -> bool {
        self.by_router.remove(router).is_some()
    }

    /// The kind the observations show.
    pub(crate) fn kind(&self) -> NatKind {
        let mut addrs = self.by_router.values();
        let Some(first) = addrs.next() else {
            return NatKind::Unknown;
        };
        if self.by_router.len() == 1 {
            return NatKind::Single;
        }
        if addrs.all(|a| a == first) {
            NatKind::EndpointIndependent
        } else {
            NatKind::EndpointDependent
        }
    }

    /// The address a peer should punch to: the one the routers agree on
    /// (or the only one); `None` for an endpoint-dependent NAT.
    pub(crate) fn candidate(&self) -> Option<SocketAddr> {
        self.kind()
            .may_punch()
            .then(|| self.by_router.values().next().copied())
            .flatten()
    }

    /// Every observation, by router.
    pub(crate) fn all(&self) -> impl Iterator<Item = (&PeerId, &SocketAddr)> {
        self.by_router.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("sa")
    }

    #[test]
    fn two_routers_seeing_one_port_is_endpoint_independent_and_different_ports_are_not() {
        let (r1, r2) = (PeerId::random(), PeerId::random());
        let mut o = Observed::default();
        assert_eq!(o.kind(), NatKind::Unknown);
        assert_eq!(o.candidate(), None);
        assert!(o.set(r1, sa("10.0.0.5:4500")));
        assert!(!o.set(r1, sa("10.0.0.5:4500")), "no change");
        assert_eq!(o.kind(), NatKind::Single);
        assert_eq!(o.candidate(), Some(sa("10.0.0.5:4500")));
        assert!(o.set(r2, sa("10.0.0.5:4500")));
        assert_eq!(o.kind(), NatKind::EndpointIndependent);
        assert_eq!(o.candidate(), Some(sa("10.0.0.5:4500")));
        // A router that sees another port: symmetric, no candidate.
        assert!(o.set(r2, sa("10.0.0.5:61001")));
        assert_eq!(o.kind(), NatKind::EndpointDependent);
        assert!(!o.kind().may_punch());
        assert_eq!(o.candidate(), None);
        // Another address is endpoint-dependent too.
        assert!(o.set(r2, sa("10.0.0.6:4500")));
        assert_eq!(o.kind(), NatKind::EndpointDependent);
        // That router gone: one observation again.
        assert!(o.remove(&r2));
        assert!(!o.remove(&r2));
        assert_eq!(o.kind(), NatKind::Single);
        assert_eq!(o.all().count(), 1);
    }

    #[test]
    fn observers_are_bounded() {
        let mut o = Observed::default();
        for _ in 0..MAX_OBSERVERS {
            assert!(o.set(PeerId::random(), sa("10.0.0.5:4500")));
        }
        assert!(!o.set(PeerId::random(), sa("10.0.0.5:1")));
        assert_eq!(o.kind(), NatKind::EndpointIndependent);
    }
}
