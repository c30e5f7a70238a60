//! Test fixtures: a control plane's key and trust, signed policies and
//! member credentials, a policy state and an ownership check over them.

use std::sync::Arc;

use agentmesh_proto::credential::{Trust, VerifiedClaims, sign, verify};
use agentmesh_proto::pb::credential::{
    Claims, Credential, KeySet, Label, PolicyDocument, PublicKey, Revocation, RevocationList, Role,
    SignedPolicy, SignedRevocations, TokenKind,
};
use agentmesh_proto::policy::sign_policy;
use agentmesh_proto::revocations::sign_revocations;
use libp2p::PeerId;
use libp2p::identity::ed25519;

use super::PolicyState;
use crate::policy_metrics::PolicyMetrics;

/// Web may call payments/api; payments owns payments/*.
pub(crate) const WEB_TO_PAYMENTS: &str = r#"
format = 1
[groups]
payments = { labels = { team = "payments" } }
web = { labels = { team = "web" } }

[[owners]]
services = ["payments/*"]
groups = ["payments"]

[[grants]]
from = ["web"]
to = ["payments/api"]
"#;

/// Payments owns payments/*, nobody may call anything.
pub(crate) const NO_GRANTS: &str = r#"
format = 1
[groups]
payments = { labels = { team = "payments" } }
web = { labels = { team = "web" } }

[[owners]]
services = ["payments/*"]
groups = ["payments"]
"#;

/// A control plane: its key and the trust that knows it.
pub(crate) struct Cp {
    pub(crate) key: ed25519::Keypair,
    pub(crate) trust: Trust,
}

/// A fresh control plane with key "k1".
pub(crate) fn cp() -> Cp {
    let key = ed25519::Keypair::generate();
    let trust = Trust::new(&KeySet {
        keys: vec![PublicKey {
            key_id: "k1".into(),
            ed25519: key.public().to_bytes().to_vec(),
            active_from_unix_secs: 0,
            verify_until_unix_secs: 0,
        }],
        ..Default::default()
    });
    Cp { key, trust }
}

/// `text` as policy (epoch, version), signed by `cp`.
pub(crate) fn signed(cp: &Cp, epoch: u64, version: u64, text: &str) -> SignedPolicy {
    sign_policy(
        &PolicyDocument {
            epoch,
            version,
            issued_at_unix_secs: 1000 + i64::try_from(version).unwrap_or(0),
            text: text.into(),
            key_id: "k1".into(),
        },
        &cp.key,
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
    sign_revocations(
        &RevocationList {
            epoch,
            generation,
            issued_at_unix_secs: issued,
            entries: entries.to_vec(),
            key_id: "k1".into(),
        },
        &cp.key,
    )
}

/// A member credential for `peer` in `team`, from token `token`, valid
/// from a minute ago for an hour.
pub(crate) fn credential(cp: &Cp, peer: &PeerId, team: &str, token: &str) -> Credential {
    sign(
        &Claims {
            subject: peer.to_bytes(),
            node_id: format!("n-{team}"),
            role: Role::Member as i32,
            token_kind: TokenKind::Bootstrap as i32,
            labels: vec![Label {
                key: "team".into(),
                value: team.into(),
            }],
            issued_at_unix_secs: agentmesh_proto::unix_now() - 60,
            expires_at_unix_secs: agentmesh_proto::unix_now() + 3600,
            key_id: "k1".into(),
            token_id: token.into(),
        },
        &cp.key,
    )
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
