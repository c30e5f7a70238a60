//! The router's slot budgets that strangers reach before they are
//! admitted, each shared fairly by source ([`agentmesh_fair::FairSlots`]):
//!
//! - `auth`: auth streams being served (`--auth-max-inflight-streams`);
//! - `catalog`: catalog streams being served (`--catalog-max-inflight-streams`;
//!   peers that are not admitted get none at all);
//! - `handshake`: inbound connections in their handshake
//!   (`--pending-connections-max`).
//!
//! While a budget has a free slot anyone gets it. When all are taken, a
//! source holding fewer than the heaviest source takes that source's
//! oldest slot (its holder is told and stops: the stream is closed, the
//! handshake denied when it ends); otherwise it is refused, since it holds
//! its share already. One source may use a whole budget while nobody else
//! asks, so a ladder joining from a few addresses is never slowed.
//!
//! Counted in `agentmesh_router_slots_refused_total{budget,reason}` and
//! `agentmesh_router_slots_preempted_total{budget}`; slots held in
//! `agentmesh_router_slots_in_use{budget}`.

use std::net::{IpAddr, Ipv6Addr};

use agentmesh_fair::{FairSlots, Slot, SlotRefusal};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// A slot budget (the `budget` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum SlotBudget {
    /// Auth streams being served.
    Auth,
    /// Catalog streams being served.
    Catalog,
    /// Inbound connections in their handshake.
    Handshake,
}

impl SlotBudget {
    /// Every budget, to pre-create labels.
    pub(crate) const ALL: [SlotBudget; 3] =
        [SlotBudget::Auth, SlotBudget::Catalog, SlotBudget::Handshake];

    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Auth => "auth",
            Self::Catalog => "catalog",
            Self::Handshake => "handshake",
        }
    }

    /// The refusal reasons this budget can count.
    pub(crate) fn reasons(self) -> &'static [SlotRefusalReason] {
        match self {
            Self::Catalog => &[
                SlotRefusalReason::SourceShare,
                SlotRefusalReason::NotAdmitted,
            ],
            Self::Auth | Self::Handshake => &[SlotRefusalReason::SourceShare],
        }
    }
}

/// Why a slot was refused (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum SlotRefusalReason {
    /// Every slot is taken and the source holds its share.
    SourceShare,
    /// The peer is not admitted, and the budget serves admitted peers only.
    NotAdmitted,
}

impl SlotRefusalReason {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::SourceShare => "source_share",
            Self::NotAdmitted => "not_admitted",
        }
    }
}

/// The counters of every slot budget (registered by the resource metrics).
#[derive(Debug, Clone, Default)]
pub(crate) struct SlotMetrics {
    pub(crate) refused: Family<[(&'static str, &'static str); 2], Counter>,
    pub(crate) preempted: Family<[(&'static str, &'static str); 1], Counter>,
    pub(crate) in_use: Family<[(&'static str, &'static str); 1], Gauge>,
    pub(crate) capacity: Family<[(&'static str, &'static str); 1], Gauge>,
}

impl SlotMetrics {
    /// Creates every label value at 0.
    pub(crate) fn precreate(&self) {
        for b in SlotBudget::ALL {
            for r in b.reasons() {
                let _ = self
                    .refused
                    .get_or_create(&[("budget", b.as_str()), ("reason", r.as_str())]);
            }
            let _ = self.preempted.get_or_create(&[("budget", b.as_str())]);
            let _ = self.in_use.get_or_create(&[("budget", b.as_str())]);
            let _ = self.capacity.get_or_create(&[("budget", b.as_str())]);
        }
    }
}

/// The address a source-less stream or connection counts under (one
/// shared source: only direct connections carry an address).
const NO_SOURCE: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

/// One slot budget, shared fairly by source, with its counters.
#[derive(Debug, Clone)]
pub(crate) struct FairBudget {
    budget: SlotBudget,
    slots: FairSlots,
    metrics: SlotMetrics,
}

/// A slot held; freed (and uncounted) on drop.
#[derive(Debug)]
pub(crate) struct HeldSlot {
    slot: Slot,
    in_use: Gauge,
}

impl HeldSlot {
    /// Completes when the slot was taken for another source: stop what it
    /// paid for.
    pub(crate) async fn revoked(&self) {
        self.slot.revoked().await;
    }

    /// Whether the slot was taken for another source.
    pub(crate) fn is_revoked(&self) -> bool {
        self.slot.is_revoked()
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        self.in_use.dec();
    }
}

impl FairBudget {
    /// `capacity` slots of `budget` (at least 1), IPv6 sources keyed at
    /// `ipv6_prefix_len` bits; counted in `metrics`.
    pub(crate) fn new(
        budget: SlotBudget,
        capacity: usize,
        ipv6_prefix_len: u8,
        metrics: SlotMetrics,
    ) -> Self {
        let capacity = capacity.max(1);
        metrics
            .capacity
            .get_or_create(&[("budget", budget.as_str())])
            .set(i64::try_from(capacity).unwrap_or(i64::MAX));
        // At most `capacity` sources hold slots at once: the table never
        // needs more, and aggregates IPv6 sources once half of them are
        // distinct (a flood of /64s then counts as its /56 or /48).
        Self {
            budget,
            slots: FairSlots::new(capacity, capacity, ipv6_prefix_len),
            metrics,
        }
    }

    /// A slot for a request from `ip` (`None`: a connection without an
    /// address), taking the heaviest source's oldest when all are taken;
    /// refusals and preemptions counted.
    pub(crate) fn try_acquire(&self, ip: Option<IpAddr>) -> Result<HeldSlot, SlotRefusal> {
        let label = [("budget", self.budget.as_str())];
        match self.slots.try_acquire(ip.unwrap_or(NO_SOURCE)) {
            Ok(a) => {
                if a.preempted.is_some() {
                    self.metrics.preempted.get_or_create(&label).inc();
                }
                let in_use = self.metrics.in_use.get_or_create(&label).clone();
                in_use.inc();
                Ok(HeldSlot {
                    slot: a.slot,
                    in_use,
                })
            }
            Err(r) => {
                self.refused(SlotRefusalReason::SourceShare);
                Err(r)
            }
        }
    }

    /// Counts a refusal of this budget for `reason`.
    pub(crate) fn refused(&self, reason: SlotRefusalReason) {
        self.metrics
            .refused
            .get_or_create(&[
                ("budget", self.budget.as_str()),
                ("reason", reason.as_str()),
            ])
            .inc();
    }

    /// The budget's label.
    pub(crate) fn label(&self) -> &'static str {
        self.budget.as_str()
    }

    /// Slots taken now.
    #[cfg(test)]
    pub(crate) fn in_use(&self) -> usize {
        self.slots.in_use()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> Option<IpAddr> {
        Some(IpAddr::from([127, 0, 0, n]))
    }

    #[tokio::test]
    async fn a_newcomer_takes_the_heaviest_sources_oldest_and_both_are_counted() {
        let m = SlotMetrics::default();
        m.precreate();
        let b = FairBudget::new(SlotBudget::Auth, 2, 64, m.clone());
        let first = b.try_acquire(ip(66)).expect("free");
        let _second = b.try_acquire(ip(66)).expect("free");
        let label = [("budget", "auth")];
        assert_eq!(m.in_use.get_or_create(&label).get(), 2);
        // The attacker's renewal is refused: it holds every slot.
        assert!(b.try_acquire(ip(66)).is_err());
        let refused = [("budget", "auth"), ("reason", "source_share")];
        assert_eq!(m.refused.get_or_create(&refused).get(), 1);
        // A member from elsewhere gets in; the oldest is revoked.
        let _member = b.try_acquire(ip(9)).expect("preempts");
        assert_eq!(m.preempted.get_or_create(&label).get(), 1);
        tokio::time::timeout(std::time::Duration::from_secs(5), first.revoked())
            .await
            .expect("the holder is told");
        assert!(first.is_revoked());
        drop(first);
        assert_eq!(m.in_use.get_or_create(&label).get(), 2);
        assert_eq!(b.in_use(), 2);
        // Source-less requests share one source.
        assert!(b.try_acquire(None).is_err(), "full, and 1 + 1 < 1 fails");
    }
}
