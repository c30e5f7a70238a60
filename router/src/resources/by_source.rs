//! Inbound connections per source, and how many of them belong to admitted
//! peers: the two numbers every stranger's connection and handshake is
//! judged by (its source's unauthenticated connections against the cap,
//! and whether members are admitted from there, which exempts the source
//! from failed-login blocks).
//!
//! Kept as counts, updated when a connection opens or closes and when its
//! peer's admission begins or ends, so a newcomer costs O(1). Why: the
//! earlier way read the admission of every peer connected from the
//! newcomer's source, twice per connection (before and after its
//! handshake), and members behind one address (one NAT, one Kubernetes
//! node's SNAT, or loopback in the ladder) are thousands of peers: a
//! router re-admitting 5,000 members from one source spent O(n²) on it.
//!
//! The manager owns this under its state lock; its peers' `admitted` flags
//! say which connections count as admitted (see `ResourceManager::peer_admitted`
//! and `ResourceManager::peer_removed`).

use std::collections::HashMap;

use crate::shrink::ShrinkSparse;

use super::source::SourceKey;

/// One source's inbound connections.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SourceCount {
    /// Inbound connections open (charged) from the source.
    pub(crate) connections: u32,
    /// Of them, those whose peer is admitted.
    pub(crate) admitted: u32,
}

impl SourceCount {
    /// Connections from the source whose peer is not admitted.
    pub(crate) fn unauthenticated(self) -> u32 {
        self.connections.saturating_sub(self.admitted)
    }

    /// Whether any admitted member is connected from the source.
    pub(crate) fn has_members(self) -> bool {
        self.admitted > 0
    }
}

/// [`SourceCount`] of every source with an inbound connection open.
#[derive(Debug, Default)]
pub(crate) struct BySource {
    counts: HashMap<SourceKey, SourceCount>,
}

impl BySource {
    /// The count of `source` (zeros when nothing is open from it).
    pub(crate) fn get(&self, source: &SourceKey) -> SourceCount {
        self.counts.get(source).copied().unwrap_or_default()
    }

    /// A connection from `source` opened; `admitted`: its peer is.
    pub(crate) fn opened(&mut self, source: SourceKey, admitted: bool) {
        let c = self.counts.entry(source).or_default();
        c.connections = c.connections.saturating_add(1);
        if admitted {
            c.admitted = c.admitted.saturating_add(1);
        }
    }

    /// A connection from `source` closed; `admitted`: its peer was counted admitted.
    pub(crate) fn closed(&mut self, source: &SourceKey, admitted: bool) {
        let Some(c) = self.counts.get_mut(source) else {
            return;
        };
        c.connections = c.connections.saturating_sub(1);
        if admitted {
            c.admitted = c.admitted.saturating_sub(1);
        }
        if c.connections == 0 {
            self.counts.remove(source);
            self.counts.shrink_sparse();
        }
    }

    /// The peer of one open connection from `source` was admitted
    /// (`true`) or lost its admission (`false`).
    pub(crate) fn admission(&mut self, source: &SourceKey, admitted: bool) {
        if let Some(c) = self.counts.get_mut(source) {
            c.admitted = if admitted {
                c.admitted.saturating_add(1).min(c.connections)
            } else {
                c.admitted.saturating_sub(1)
            };
        }
    }

    /// Sources with a connection open.
    pub(crate) fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether no source has a connection open.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Every source's count.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&SourceKey, &SourceCount)> {
        self.counts.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ip: &str) -> SourceKey {
        SourceKey::new(ip.parse().expect("ip"), 64)
    }

    #[test]
    fn counts_follow_opens_closes_and_admissions() {
        let (a, b) = (key("10.0.0.1"), key("10.0.0.2"));
        let mut s = BySource::default();
        s.opened(a, false);
        s.opened(a, false);
        s.opened(a, true);
        s.opened(b, false);
        assert_eq!(s.get(&a).unauthenticated(), 2);
        assert!(s.get(&a).has_members());
        assert!(!s.get(&b).has_members());

        s.admission(&a, true);
        assert_eq!(s.get(&a).unauthenticated(), 1);
        s.admission(&a, false);
        s.admission(&a, false);
        assert_eq!(s.get(&a).unauthenticated(), 3);
        assert!(!s.get(&a).has_members());

        s.closed(&a, false);
        s.closed(&a, false);
        s.closed(&a, false);
        assert_eq!(s.get(&a), SourceCount::default());
        assert_eq!(s.len(), 1, "a source with nothing open is forgotten");
    }

    #[test]
    fn admitted_never_exceeds_connections_and_unknown_sources_are_ignored() {
        let a = key("10.0.0.1");
        let mut s = BySource::default();
        s.admission(&a, true);
        s.closed(&a, true);
        assert_eq!(s.len(), 0);
        s.opened(a, false);
        s.admission(&a, true);
        s.admission(&a, true);
        assert_eq!(
            s.get(&a),
            SourceCount {
                connections: 1,
                admitted: 1
            }
        );
    }
}
