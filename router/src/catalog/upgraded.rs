//! The catalog's `upgraded` op: a member tells its router that a circuit
//! through it was replaced by a direct connection (a hole punch), and the
//! router counts the circuit (`agentmesh_router_circuits_upgraded_total`).
//!
//! Only a member can know this: the circuit is end-to-end encrypted and the
//! direct connection never touches the router. So the router believes a
//! notice only as far as it can check it: the sender must be admitted and
//! at one end of a circuit the router relays *now* to the peer it names,
//! and each circuit is counted once (`crate::resources::circuits`). A
//! member that lies can mark only its own live circuits, each once; every
//! notice that marks nothing is counted by reason
//! (`agentmesh_router_upgrade_notices_refused_total{reason}`).
//!
//! An op of the catalog protocol rather than a protocol of its own: the
//! catalog is already the member's one request-and-answer protocol to its
//! router, its streams are admitted members' only and take the catalog's
//! fair slots (`--catalog-max-inflight-streams`), and it answers an ack or
//! a refusal with its reason, all this one-frame notice needs.

use agentmesh_proto::pb::mesh::Upgraded;
use agentmesh_wire::catalog::upgraded_peer;
use libp2p::PeerId;

use crate::admission::Admissions;
use crate::metrics::Metrics;
use crate::resources::circuits::MarkRefusal;

/// Marks live circuits upgraded away (the resource manager's registry).
/// A trait so the catalog does not depend on the resource manager.
pub(crate) trait UpgradeMarks: Send + Sync {
    fn mark_upgraded(&self, member: &PeerId, peer: &PeerId) -> Result<(), MarkRefusal>;
}

impl UpgradeMarks for crate::resources::ResourceManager {
    fn mark_upgraded(&self, member: &PeerId, peer: &PeerId) -> Result<(), MarkRefusal> {
        crate::resources::ResourceManager::mark_upgraded(self, member, peer)
    }
}

impl UpgradeMarks for crate::resources::circuits::LiveCircuits {
    fn mark_upgraded(&self, member: &PeerId, peer: &PeerId) -> Result<(), MarkRefusal> {
        crate::resources::circuits::LiveCircuits::mark_upgraded(self, member, peer)
    }
}

/// Judges `member`'s notice `u` at `now`: `Ok` when it marked a circuit,
/// or the refusal's reason label and what the member is told. Counts
/// either way.
pub(crate) fn judge(
    marks: &dyn UpgradeMarks,
    admissions: &Admissions,
    metrics: &Metrics,
    member: &PeerId,
    u: &Upgraded,
    now: i64,
) -> Result<(), (&'static str, String)> {
    let r = check(marks, admissions, member, u, now);
    match &r {
        Ok(()) => {
            metrics.relay.circuits_upgraded.inc();
        }
        Err((reason, _)) => {
            metrics
                .relay
                .upgrade_notices_refused
                .get_or_create(&[("reason", reason)])
                .inc();
        }
    }
    r
}

fn check(
    marks: &dyn UpgradeMarks,
    admissions: &Admissions,
    member: &PeerId,
    u: &Upgraded,
    now: i64,
) -> Result<(), (&'static str, String)> {
    let Some(peer) = upgraded_peer(u) else {
        return Err(("malformed", "the peer named is not a PeerId".into()));
    };
    if !admissions.read().is_admitted(member, now) {
        return Err(("not_admitted", "not admitted".into()));
    }
    marks.mark_upgraded(member, &peer).map_err(|r| match r {
        MarkRefusal::NoSuchCircuit => (
            "no_such_circuit",
            format!("no live circuit between you and {peer} through this router"),
        ),
        MarkRefusal::Duplicate => (
            "duplicate",
            format!("every live circuit between you and {peer} was counted already"),
        ),
    })
}
