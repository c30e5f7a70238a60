//! Test fixtures: a control plane's key and trust, signed policies and
//! member credentials, a policy state and an ownership check over them.

use std::sync::Arc;

use agentmesh_proto::credential::{VerifiedClaims, verify};
use agentmesh_proto::pb::credential::{Credential, Revocation, SignedPolicy, SignedRevocations};
use libp2p::PeerId;

use super::PolicyState;
use crate::policy_metrics::PolicyMetrics;

pub(crate) use agentmesh_proto::testing::{NO_GRANTS, TestCp as Cp, WEB_TO_PAYMENTS};

/// A fresh control plane.
pub(crate) fn cp() -> Cp {
    Cp::new()
}

/// `text` as policy (epoch, version), issued at `1000 + version`, signed by `cp`.
pub(crate) fn signed(cp: &Cp, epoch: u64, version: u64, text: &str) -> SignedPolicy {
    cp.policy(
        epoch,
        version,
        1000 + i64::try_from(version).unwrap_or(0),
        text,
    )
}

/// `entries` as revocation list (epoch, generation), issued at `issued`,
/// signed by `cp`.
pub(crate) fn signed_list(
    cp: &Cp,
    epoch: u64,
    generation: u64,
    issued: i64,
    entries: &[Revocation],
) -> SignedRevocations {
    cp.revocations(epoch, generation, issued, entries)
}

/// A member credential for `peer` in `team`, from token `token`, valid
/// from a minute ago for an hour.
pub(crate) fn credential(cp: &Cp, peer: &PeerId, team: &str, token: &str) -> Credential {
    let now = agentmesh_proto::unix_now();
    cp.member(peer, team, token, now - 60..now + 3600)
}

/// The verified claims of [`credential`].
pub(crate) fn claims(cp: &Cp, peer: &PeerId, team: &str, token: &str) -> VerifiedClaims {
    let now = agentmesh_proto::unix_now();
    verify(
        &credential(cp, peer, team, token),
        &cp.trust,
        now,
        Some(peer),
        0,
    )
    .expect("fixture credential verifies")
}

/// A policy state with fresh metrics.
pub(crate) fn state() -> Arc<PolicyState> {
    Arc::new(PolicyState::new(PolicyMetrics::default()))
}

/// A record of `services` by `key`'s peer, carrying `credential`, valid
/// ten minutes.
pub(crate) fn record(
    key: &libp2p::identity::Keypair,
    services: &[&str],
    credential: Option<Credential>,
) -> (
    agentmesh_proto::pb::mesh::ServiceRecord,
    agentmesh_proto::pb::mesh::SignedRecord,
) {
    let now = agentmesh_proto::unix_now();
    let r = agentmesh_proto::pb::mesh::ServiceRecord {
        provider: key.public().to_peer_id().to_bytes(),
        services: services.iter().map(|s| s.to_string()).collect(),
        issued_at_unix_secs: now,
        expires_at_unix_secs: now + 600,
        credential,
        ..Default::default()
    };
    let signed = agentmesh_proto::record::sign_record(&r, key);
    (r, signed)
}
