//! Inbound handshakes on the member's listening port (`--direct=true`):
//! the node's side of [`agentmesh_fair::handshakes`], the table the
//! router's listener uses too.
//!
//! A stranger can reach the listening port before anything says who it
//! is, and each handshake (noise and yamux, or QUIC's TLS) costs memory
//! and CPU, so they are bounded. Fixed caps alone (at most N from one IP,
//! M in all, the rest refused) let a flood of stalled connections from a
//! few hosts hold every slot: a peer's punch landing meanwhile was
//! refused. Here a newcomer never waits behind a stalled handshake: at its
//! source's share or at the global budget, the handshake that progressed
//! least (on TCP, counted in turns on the raw socket; on QUIC, whose
//! packets share one socket, the oldest) is closed to make room for it. A
//! flood renewing its stalled connections keeps closing its own; a peer
//! whose handshake moves (a punch, which answers at once) completes.
//!
//! The transport runs the table as each connection is accepted, before a
//! byte of it is read and before the swarm sees it (`super::direct`); so
//! the direct behaviour keeps no count of its own, and a connection the
//! table refuses or sheds never reaches any behaviour.
//!
//! A TCP connection the listener holds back for a punch landing on it
//! (`reuse/held.rs`: silent, waiting for our own dial to take it) counts
//! from its accept and stays at stage 0 until it is handed on, so a flood
//! from the peer's own source, or one making its source the heaviest,
//! can shed it like a stalled one: that punch then fails and is tried
//! again after its backoff. It is held for at most a second.
//!
//! Budgets: `--direct-max-pending-inbound` handshakes in all,
//! `--direct-max-pending-inbound-per-source` from one source (an IPv4
//! address or an IPv6 /64). Counted in
//! `agentmesh_node_inbound_refused_total{reason}` (the `handshake_shed_*`
//! reasons and `pending_full`) and
//! `agentmesh_node_direct_handshakes_in_progress`.

use agentmesh_fair::handshakes::{
    Events, Handshakes, Limits, PerSource, RefuseReason, Shed, ShedReason,
};

use crate::metrics::DirectMetrics;

/// The prefix IPv6 sources are keyed at: one host usually holds a whole
/// /64 (SLAAC, privacy addresses), so a flood rotating addresses inside
/// it is one source.
const IPV6_SOURCE_PREFIX_LEN: u8 = 64;

/// The table of a member listening with `max_pending` handshakes in all
/// and `per_source` from one source (0 acts as 1 for both: a listener
/// that could hold no handshake would take no punch), counting in
/// `metrics`.
pub(crate) fn table(max_pending: usize, per_source: usize, metrics: DirectMetrics) -> Handshakes {
    let limits = Limits {
        max_pending: max_pending.max(1),
        ipv6_prefix_len: IPV6_SOURCE_PREFIX_LEN,
    };
    metrics.direct_handshakes_in_progress.set(0);
    Handshakes::new(limits, PerSource(per_source.max(1)), Counted(metrics))
}

/// The `inbound_refused_total` reason of a handshake shed for a newcomer.
fn shed_reason(reason: ShedReason) -> &'static str {
    match reason {
        ShedReason::SourceFull => "handshake_shed_source_full",
        ShedReason::BudgetFull => "handshake_shed_budget_full",
        ShedReason::LighterSource => "handshake_shed_lighter_source",
    }
}

/// The `inbound_refused_total` reason of a newcomer refused at accept.
fn refuse_reason(reason: RefuseReason) -> &'static str {
    match reason {
        // Every slot taken, its source holds its share and none of them.
        RefuseReason::BudgetShare => "pending_full",
        // Its source may hold none and holds none: never with a room of at
        // least 1 ([`PerSource`] above); counted with the budget's should
        // a gate ever give less.
        RefuseReason::SourceFull => "pending_full",
    }
}

/// What the table tells the member to count.
struct Counted(DirectMetrics);

impl Events for Counted {
    fn shed(&self, s: Shed) {
        tracing::debug!(
            source = %s.source,
            reason = s.reason.as_str(),
            progress = s.progressed.as_str(),
            "inbound handshake closed to make room for a newcomer"
        );
        self.0.refused(shed_reason(s.reason));
    }

    fn refused(&self, reason: RefuseReason) {
        self.0.refused(refuse_reason(reason));
    }

    fn in_progress(&self, n: usize) {
        self.0
            .direct_handshakes_in_progress
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}
