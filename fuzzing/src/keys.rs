//! Fixed test keys and the `Trust` every target verifies against, so the
//! harness can sign what the fuzzer wrote and reach the checks behind the
//! signature. Seeds are built from the same keys, so they stay valid.

use std::sync::OnceLock;

use agentmesh_proto::credential::{DOMAIN_PREFIX, Trust};
use agentmesh_proto::identity::{Keypair, PeerId, ed25519};
use agentmesh_proto::pb::credential::{
    Claims, Credential, KeySet, PublicKey as KeyEntry, Revocation, Role, TokenKind,
};

/// The clock of every target that does not take its own from the input.
pub const NOW: i64 = 1_700_000_000;

/// Id of the control plane's current signing key (verifies forever).
pub const CURRENT_KEY_ID: &str = "k1";
/// Id of a retired signing key: it verifies until [`RETIRED_UNTIL`].
pub const RETIRED_KEY_ID: &str = "k0";
/// End of the retired key's grace.
pub const RETIRED_UNTIL: i64 = NOW - 3_600;
/// Id of a key-set entry whose key bytes do not parse (the trust skips it).
pub const BROKEN_KEY_ID: &str = "broken";
/// Skew every frame target verifies with (seconds).
pub const SKEW_SECS: i64 = 60;

fn ed25519_key(seed: u8) -> ed25519::Keypair {
    let secret =
        ed25519::SecretKey::try_from_bytes([seed; 32]).expect("32 bytes are an ed25519 secret");
    ed25519::Keypair::from(secret)
}

fn libp2p_key(seed: u8) -> Keypair {
    Keypair::from(ed25519_key(seed))
}

/// The control plane's signing keys: current, retired, and a stranger's
/// (a key the trust does not hold).
pub struct SigningKeys {
    /// Signs as [`CURRENT_KEY_ID`].
    pub current: ed25519::Keypair,
    /// Signs as [`RETIRED_KEY_ID`].
    pub retired: ed25519::Keypair,
    /// In no key set.
    pub stranger: ed25519::Keypair,
}

/// The signing keys (built once).
pub fn signing() -> &'static SigningKeys {
    static KEYS: OnceLock<SigningKeys> = OnceLock::new();
    KEYS.get_or_init(|| SigningKeys {
        current: ed25519_key(1),
        retired: ed25519_key(2),
        stranger: ed25519_key(3),
    })
}

/// Member libp2p identities: `peers()[0]` is the member every frame target
/// takes as the transport-proven peer; `peers()[3]` is revoked in [`trust`].
pub fn peers() -> &'static [Keypair; 4] {
    static PEERS: OnceLock<[Keypair; 4]> = OnceLock::new();
    PEERS.get_or_init(|| {
        [
            libp2p_key(10),
            libp2p_key(11),
            libp2p_key(12),
            libp2p_key(13),
        ]
    })
}

/// PeerId of `peers()[i]`.
pub fn peer(i: usize) -> PeerId {
    peers()[i % 4].public().to_peer_id()
}

/// The key set the control plane would publish: current, retired, and an
/// entry that does not parse.
pub fn key_set() -> KeySet {
    let k = signing();
    KeySet {
        keys: vec![
            KeyEntry {
                key_id: CURRENT_KEY_ID.into(),
                ed25519: k.current.public().to_bytes().to_vec(),
                active_from_unix_secs: NOW - 100_000,
                verify_until_unix_secs: 0,
            },
            KeyEntry {
                key_id: RETIRED_KEY_ID.into(),
                ed25519: k.retired.public().to_bytes().to_vec(),
                active_from_unix_secs: NOW - 200_000,
                verify_until_unix_secs: RETIRED_UNTIL,
            },
            KeyEntry {
                key_id: BROKEN_KEY_ID.into(),
                ed25519: vec![0xff; 31],
                active_from_unix_secs: 0,
                verify_until_unix_secs: 0,
            },
        ],
        ..Default::default()
    }
}

/// Revocations: `peer(3)` for good, plus an entry that is not a PeerId.
pub fn revocations() -> Vec<Revocation> {
    vec![
        Revocation {
            peer_id: peer(3).to_bytes(),
            until_unix_secs: i64::MAX,
            reason: "test".into(),
            token_id: String::new(),
        },
        Revocation {
            peer_id: b"not a peer id".to_vec(),
            until_unix_secs: i64::MAX,
            reason: String::new(),
            token_id: String::new(),
        },
    ]
}

/// Until when [`revocations`] revokes `p`.
pub fn revoked_until(p: &PeerId) -> Option<i64> {
    (*p == peer(3)).then_some(i64::MAX)
}

/// What a router or node trusts: [`key_set`] and [`revocations`].
pub fn trust() -> &'static Trust {
    static TRUST: OnceLock<Trust> = OnceLock::new();
    TRUST.get_or_init(|| {
        let mut t = Trust::new(&key_set());
        t.set_revocations(&revocations());
        t
    })
}

/// The public key the trust holds under `key_id`, if any.
pub fn trusted_key(key_id: &str) -> Option<(ed25519::PublicKey, i64)> {
    let k = signing();
    match key_id {
        CURRENT_KEY_ID => Some((k.current.public(), 0)),
        RETIRED_KEY_ID => Some((k.retired.public(), RETIRED_UNTIL)),
        _ => None,
    }
}

/// Signs claim bytes as they are (not re-encoded) with `key`.
pub fn sign_claim_bytes(claims: &[u8], key: &ed25519::Keypair) -> Credential {
    let mut msg = DOMAIN_PREFIX.to_vec();
    msg.extend_from_slice(claims);
    Credential {
        claims: claims.to_vec(),
        signature: key.sign(&msg),
    }
}

/// Member claims for `peer(i)`, valid from `NOW - 60` to `NOW + 3600`.
pub fn member_claims(i: usize, role: Role) -> Claims {
    Claims {
        subject: peer(i).to_bytes(),
        node_id: format!("n-{i}"),
        role: role as i32,
        token_kind: TokenKind::Bootstrap as i32,
        labels: vec![agentmesh_proto::pb::credential::Label {
            key: "team".into(),
            value: "fuzz".into(),
        }],
        issued_at_unix_secs: NOW - 60,
        expires_at_unix_secs: NOW + 3_600,
        key_id: CURRENT_KEY_ID.into(),
        token_id: String::new(),
    }
}

/// [`member_claims`] signed with the current key.
pub fn member_credential(i: usize, role: Role) -> Credential {
    agentmesh_proto::credential::sign(&member_claims(i, role), &signing().current)
}
