//! Go-away metrics: go-aways sent, connections trimmed, and the paced
//! waves of a drain or a trim (their labels are pre-created by
//! `crate::goaway` and `crate::trim`, which own the vocabulary).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{L1, L2};

/// Go-away, trim and wave metrics.
#[derive(Debug, Clone, Default)]
pub(crate) struct GoAwayMetrics {
    pub(crate) sent: Family<L2, Counter>,
    pub(crate) trimmed: Family<L1, Counter>,
    pub(crate) waves: Family<L1, Counter>,
    pub(crate) wave_members: Family<L2, Gauge>,
    pub(crate) wave_rate: Family<L1, Gauge>,
    pub(crate) wave_reattach: Family<L1, Gauge>,
    pub(crate) waves_adjusted: Family<L2, Counter>,
}

impl GoAwayMetrics {
    /// Registers them in `r` (labels: see the module docs).
    pub(crate) fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        r.register(
            "agentmesh_router_goaway_sent",
            "Go-aways sent to members, by reason and result",
            m.sent.clone(),
        );
        r.register(
            "agentmesh_router_trimmed",
            "Connections shed above the high watermark, by reason",
            m.trimmed.clone(),
        );
        r.register(
            "agentmesh_router_goaway_waves",
            "Waves of paced go-aways sent, by reason (draining: the drain; overloaded: the trim)",
            m.waves.clone(),
        );
        r.register(
            "agentmesh_router_goaway_wave_members",
            "Members of the current paced go-away, by reason and state (waiting: not told yet, \
             still served here; moving: told, not left yet)",
            m.wave_members.clone(),
        );
        r.register(
            "agentmesh_router_goaway_wave_rate_members_per_sec",
            "Pace of the current paced go-away, members per second \
             (--drain-rate-members-per-sec times the surviving routers; 0 unpaced)",
            m.wave_rate.clone(),
        );
        r.register(
            "agentmesh_router_goaway_wave_reattach_members_per_sec",
            "Members told to go that left this router over the last 5 s, per second: \
             the re-attach rate the survivors achieve",
            m.wave_reattach.clone(),
        );
        r.register(
            "agentmesh_router_goaway_waves_adjusted",
            "Waves the pacing rule changed, by reason and why (held_back: members moving \
             exceeded 5 s of the pace; room: the survivors' advertised room; deadline: \
             enlarged to tell everyone within the grace)",
            m.waves_adjusted.clone(),
        );
        m
    }
}
