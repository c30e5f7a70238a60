//! Test fixtures every crate's tests share: a control plane's signing key
//! and the trust that knows it, and what that control plane signs
//! (policies, revocation lists, member credentials), so each crate's
//! tests do not keep a copy of their own. Built for this crate's tests and
//! behind the `testing` feature for other crates' (dev-dependencies only,
//! never a program); `agentmesh-testkit` re-exports it.

use std::ops::Range;

use libp2p_identity::{PeerId, ed25519};

use crate::credential::{Trust, sign};
use crate::pb::credential::{
    Claims, Credential, KeySet, Label, PolicyDocument, PublicKey, Revocation, RevocationList, Role,
    SignedPolicy, SignedRevocations, TokenKind,
};
use crate::policy::sign_policy;
use crate::revocations::sign_revocations;

/// The key id every fixture signs with.
pub const KEY_ID: &str = "k1";

/// Web may call `payments/api`; payments owns `payments/*`.
pub const WEB_TO_PAYMENTS: &str = r#"
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

/// Payments owns `payments/*`; nobody may call anything.
pub const NO_GRANTS: &str = r#"
format = 1
[groups]
payments = { labels = { team = "payments" } }
web = { labels = { team = "web" } }

[[owners]]
services = ["payments/*"]
groups = ["payments"]
"#;

/// A control plane: its signing key (id [`KEY_ID`]) and a trust that
/// knows only that key.
pub struct TestCp {
    pub key: ed25519::Keypair,
    pub trust: Trust,
}

impl Default for TestCp {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCp {
    /// A control plane with a fresh key.
    pub fn new() -> Self {
        let key = ed25519::Keypair::generate();
        let trust = Trust::new(&Self::key_set_of(&key));
        Self { key, trust }
    }

    /// The key set that publishes `key` as [`KEY_ID`], always valid.
    fn key_set_of(key: &ed25519::Keypair) -> KeySet {
        KeySet {
            keys: vec![PublicKey {
                key_id: KEY_ID.into(),
                ed25519: key.public().to_bytes().to_vec(),
                active_from_unix_secs: 0,
                verify_until_unix_secs: 0,
            }],
            ..Default::default()
        }
    }

    /// Its key set, as the control plane serves it.
    pub fn key_set(&self) -> KeySet {
        Self::key_set_of(&self.key)
    }

    /// `text` as policy (`epoch`, `version`) issued at `issued_at`, signed.
    pub fn policy(&self, epoch: u64, version: u64, issued_at: i64, text: &str) -> SignedPolicy {
        sign_policy(
            &PolicyDocument {
                epoch,
                version,
                issued_at_unix_secs: issued_at,
                text: text.into(),
                key_id: KEY_ID.into(),
            },
            &self.key,
        )
    }

    /// `entries` as revocation list (`epoch`, `generation`) issued at
    /// `issued_at`, signed.
    pub fn revocations(
        &self,
        epoch: u64,
        generation: u64,
        issued_at: i64,
        entries: &[Revocation],
    ) -> SignedRevocations {
        sign_revocations(
            &RevocationList {
                epoch,
                generation,
                issued_at_unix_secs: issued_at,
                entries: entries.to_vec(),
                key_id: KEY_ID.into(),
            },
            &self.key,
        )
    }

    /// A member credential for `peer` labelled `team=TEAM`, enrolled with
    /// token `token` (node id `n-TEAM`), valid over `valid` (Unix seconds).
    pub fn member(&self, peer: &PeerId, team: &str, token: &str, valid: Range<i64>) -> Credential {
        sign(&member_claims(peer, team, token, valid), &self.key)
    }
}

/// The claims of [`TestCp::member`], unsigned: for a test that changes
/// one (a router's role, an unknown key id) or signs them with a key of
/// its own (a forger).
pub fn member_claims(peer: &PeerId, team: &str, token: &str, valid: Range<i64>) -> Claims {
    Claims {
        subject: peer.to_bytes(),
        node_id: format!("n-{team}"),
        role: Role::Member as i32,
        token_kind: TokenKind::Bootstrap as i32,
        labels: vec![Label {
            key: "team".into(),
            value: team.into(),
        }],
        issued_at_unix_secs: valid.start,
        expires_at_unix_secs: valid.end,
        key_id: KEY_ID.into(),
        token_id: token.into(),
    }
}

/// A revocation of every credential enrolled with `token`, until `until`.
pub fn token_revoked(token: &str, until: i64) -> Revocation {
    Revocation {
        token_id: token.into(),
        until_unix_secs: until,
        ..Default::default()
    }
}
