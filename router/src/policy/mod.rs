//! The access policy at the router: what it holds, how it learns a new
//! version, and what it enforces.
//!
//! - `state`: the held policy and revocation list, both signed by the
//!   control plane (one owner; no policy held = deny all), verified with
//!   the router's `Trust`;
//! - this file: [`PolicyCtx`], which takes a state from the control plane
//!   (directory poll or watch) and enforces a change at once: regroups the
//!   admitted peers, drops catalog records no longer owned, cuts circuits
//!   no longer allowed, and wakes the push;
//! - `publish`: the ownership check on every published record;
//! - `push`: pushing a new state to every attached member;
//! - `watch`: the control-plane `Watch` stream (the directory poll is the
//!   fallback);
//! - `crate::policy_metrics`: every policy metric, labels pre-created (a
//!   module of its own: `crate::metrics` holds them).
//!
//! The circuit check itself runs in the muxer (`resources::circuits`
//! explains why) through [`CircuitCheck`].

pub(crate) mod publish;
pub(crate) mod push;
pub(crate) mod state;
pub(crate) mod watch;

use std::sync::Arc;

use agentmesh_proto::credential::Trust;
use agentmesh_proto::pb::credential::{SignedPolicy, SignedRevocations};
use agentmesh_proto::pb::mesh::SignedRecord;
use agentmesh_proto::record::read_stored_record;
use agentmesh_proto::unix_now;
use libp2p::PeerId;

use crate::admission::{AdmissionTable, Admissions};
use crate::cp::Link;
use crate::resources::{CircuitPolicy, ResourceManager};
use state::{Changed, PolicyState};

/// What taking and enforcing a policy needs.
#[derive(Clone)]
pub(crate) struct PolicyCtx {
    pub(crate) state: Arc<PolicyState>,
    pub(crate) link: Arc<Link>,
    pub(crate) admissions: Admissions,
    /// Regroups admissions, installs revocations and drops records no
    /// longer owned (the swarm loop's tables).
    pub(crate) tables: crate::tables::Handle,
    pub(crate) resources: Arc<ResourceManager>,
    /// The clock skew tolerated on credentials, seconds.
    pub(crate) skew_secs: i64,
}

impl crate::cp::TakePolicy for PolicyCtx {
    fn take<'a>(
        &'a self,
        policy: Option<&'a SignedPolicy>,
        revocations: Option<&'a SignedRevocations>,
        source: &'static str,
    ) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(async move {
            PolicyCtx::take(self, policy, revocations, source).await;
        })
    }

    fn held(&self) -> (u64, u64) {
        self.state.version()
    }
}

impl PolicyCtx {
    /// Takes what the control plane sent (`source`: "directory" or
    /// "watch"): offers the signed policy and revocation list (each
    /// verified, taken if newer), has the swarm loop install the list held
    /// in the router's trust, then starts the push round, and enforces
    /// whatever changed at once.
    /// Revoked peers themselves are dropped (and their connections closed)
    /// by the swarm loop's next tick, which reads the same trust.
    pub(crate) async fn take(
        &self,
        policy: Option<&SignedPolicy>,
        revocations: Option<&SignedRevocations>,
        source: &'static str,
    ) -> Changed {
        let taken_at = tokio::time::Instant::now();
        let changed = {
            let trust = self.link.trust.read();
            self.state
                .offer(policy, revocations, &trust, unix_now(), source)
        };
        let retry = self.state.take_revocations_unapplied();
        let mut reinstalled = false;
        if changed.revocations_copy || retry {
            // What the state holds now, not what this call brought: a
            // concurrent take (poll and watch) may have taken a newer one.
            // Not installed in time (logged and counted by the handle):
            // noted, and the next take (the next directory poll at the
            // latest) installs it again; until then the trust lists the
            // previous list.
            let entries = self.state.revocation_entries();
            if self.tables.set_revocations(entries).await.is_err() {
                self.state.revocations_unapplied();
            } else {
                reinstalled = retry;
            }
        }
        if changed.any() {
            // The push round starts once the list is in the trust (or
            // could not be put there in time): it reads the trust to leave
            // out the members being revoked.
            self.state.announce(taken_at);
        }
        if changed.any() || reinstalled {
            self.enforce().await;
        }
        changed
    }

    /// Enforces the state held on what is already admitted, stored and
    /// relayed.
    async fn enforce(&self) {
        let policy = self.state.policy();
        // Not regrouped in time (logged and counted by the handle): never
        // wrong, only slower: `PeerGroups::under` computes a peer's groups
        // under the new policy on each check until a later change regroups.
        let _ = self.tables.regroup(policy.clone()).await;
        let now = unix_now();
        let skew_secs = self.skew_secs;
        let owned_under = policy.clone();
        // The swarm loop applies it with the trust set and admissions it
        // holds at that moment: never an older view than the check's.
        let keep = move |provider: &PeerId,
                         signed: &SignedRecord,
                         trust: &Trust,
                         admissions: &AdmissionTable| {
            // Stored records were verified when published: read, not
            // verified again (the swarm loop runs this over every record).
            read_stored_record(signed, now).is_ok_and(|(record, p)| {
                p == *provider
                    && publish::owns(
                        &record,
                        provider,
                        trust,
                        &owned_under,
                        admissions,
                        now,
                        skew_secs,
                    )
                    .is_ok()
            })
        };
        match self.tables.drop_records(keep).await {
            Ok(0) => {}
            Ok(dropped) => {
                tracing::info!(
                    records = dropped,
                    "catalog records no longer owned under the new policy: dropped"
                );
                self.state.metrics().catalog_dropped.inc_by(dropped as u64);
            }
            // Logged and counted by the handle; the records stay until the
            // next policy change, their member's departure or their expiry.
            Err(_) => {}
        }
        let cut = {
            let admissions = self.admissions.read();
            self.resources
                .cut_circuits(|s, d| admissions.may_reach(s, d, &policy))
        };
        if cut > 0 {
            tracing::info!(circuits = cut, "live circuits no longer allowed: closed");
            self.state
                .metrics()
                .circuits_closed
                .get_or_create(&[("reason", "not_granted")])
                .inc_by(cut as u64);
        }
    }
}

/// The check the muxer runs on every circuit (see `resources::circuits`):
/// `source` must be granted some service `destination` owns. Refusals are
/// counted (`not_granted`). Handed to the resource manager when it is built.
pub(crate) struct CircuitCheck {
    pub(crate) state: Arc<PolicyState>,
    pub(crate) admissions: Admissions,
}

impl CircuitPolicy for CircuitCheck {
    fn allows(&self, source: &PeerId, destination: &PeerId) -> bool {
        let policy = self.state.policy();
        let ok = self
            .admissions
            .read()
            .may_reach(source, destination, &policy);
        if !ok {
            tracing::debug!(%source, %destination, "circuit refused: not granted");
            self.state
                .metrics()
                .circuits_refused
                .get_or_create(&[("reason", "not_granted")])
                .inc();
        }
        ok
    }
}

#[cfg(test)]
mod tests;
