//! `Trust::set_keys` and `Trust::set_revocations` on key sets and
//! revocation lists as the control plane sends them, against a model: the
//! entries that parse, later duplicates replacing earlier ones.
//!
//! Input: `now: i64`, `keys_len: u16`, that many bytes of an encoded
//! `KeySet`, then an encoded `RevocationList` (its entries, as a verified
//! list gives them to the trust; the signature is `revocation_list`'s). Every
//! key of the set that is one of the fixed signing keys then signs a
//! credential for `keys::peer(0)`, which must verify exactly when that key's
//! grace and the peer's revocation allow.

use std::collections::{HashMap, HashSet};

use agentmesh_proto::credential::{Trust, sign, verify};
use agentmesh_proto::identity::{PeerId, ed25519};
use agentmesh_proto::pb::credential::{Claims, KeySet, RevocationList, Role};
use prost::Message;

use crate::Report;
use crate::input::{Reader, Writer};
use crate::keys;

/// Most keys of one input that sign a test credential (each costs a
/// signature and a verification).
const MAX_SIGNING_CHECKS: usize = 4;

/// The input bytes for `keys` and the revocation `list` checked at `now`.
pub fn encode(now: i64, keys: &[u8], list: &[u8]) -> Vec<u8> {
    Writer::new()
        .i64(now)
        .u16(keys.len() as u16)
        .bytes(keys)
        .bytes(list)
        .finish()
}

/// Runs one input.
pub fn run(data: &[u8]) -> Report {
    let mut report = Report::default();
    let mut r = Reader::new(data);
    let now = r.i64();
    let len = usize::from(r.u16());
    let key_bytes = r.bytes(len);
    let set = KeySet::decode(key_bytes).unwrap_or_else(|_| {
        report.push("keys", "malformed");
        KeySet::default()
    });
    let list = RevocationList::decode(r.rest()).unwrap_or_else(|_| {
        report.push("revocations", "malformed");
        RevocationList::default()
    });

    let mut trust = Trust::new(&set);
    trust.set_revocations(&list.entries);

    // The model: entries that parse, the last of each id or peer winning.
    let mut model_keys: HashMap<&str, (ed25519::PublicKey, i64)> = HashMap::new();
    for k in &set.keys {
        if let Ok(pk) = ed25519::PublicKey::try_from_bytes(&k.ed25519) {
            model_keys.insert(&k.key_id, (pk, k.verify_until_unix_secs));
        }
    }
    let mut model_revoked: HashMap<PeerId, i64> = HashMap::new();
    for rev in &list.entries {
        if let Ok(p) = PeerId::from_bytes(&rev.peer_id) {
            model_revoked.insert(p, rev.until_unix_secs);
        }
    }

    assert_eq!(trust.key_count(), model_keys.len());
    for k in &set.keys {
        assert_eq!(
            trust.has_key(&k.key_id),
            model_keys.contains_key(k.key_id.as_str())
        );
    }
    for (p, until) in &model_revoked {
        assert_eq!(trust.is_revoked(p, now), *until >= now, "{p} until {until}");
    }
    let revoked_now: HashSet<PeerId> = trust.revoked_peers(now).copied().collect();
    let want_now: HashSet<PeerId> = model_revoked
        .iter()
        .filter(|(_, until)| **until >= now)
        .map(|(p, _)| *p)
        .collect();
    assert_eq!(revoked_now, want_now);
    let member = keys::peer(0);
    assert_eq!(
        trust.is_revoked(&member, now),
        model_revoked.get(&member).is_some_and(|u| *u >= now)
    );
    report.push("keys", if set.keys.is_empty() { "empty" } else { "ok" });
    report.push(
        "revocations",
        if model_revoked.is_empty() {
            "none"
        } else {
            "ok"
        },
    );

    // Each known signing key the set holds signs for the member.
    let k = keys::signing();
    let known = [&k.current, &k.retired, &k.stranger];
    let mut ids: Vec<&str> = model_keys.keys().copied().collect();
    ids.sort_unstable();
    let mut checked = 0;
    for id in ids {
        let (pk, verify_until) = &model_keys[id];
        let Some(signer) = known.iter().find(|s| s.public() == *pk) else {
            continue;
        };
        if checked == MAX_SIGNING_CHECKS {
            break;
        }
        checked += 1;
        let claims = Claims {
            key_id: id.to_string(),
            issued_at_unix_secs: now.saturating_sub(10),
            expires_at_unix_secs: now.saturating_add(10),
            ..keys::member_claims(0, Role::Member)
        };
        let got = verify(&sign(&claims, signer), &trust, now, Some(&member), 0);
        let want = if *verify_until != 0 && now > *verify_until {
            "expired"
        } else if trust.is_revoked(&member, now) {
            "revoked"
        } else {
            "ok"
        };
        let outcome = got.as_ref().map_or_else(|e| e.reason(), |_| "ok");
        assert_eq!(outcome, want, "key {id:?}: {got:?}");
        report.push("key", outcome);
        // Any other key signing under this id is refused.
        let other = known
            .iter()
            .find(|s| s.public() != *pk)
            .expect("three keys");
        let forged = verify(&sign(&claims, other), &trust, now, Some(&member), 0);
        assert_eq!(
            forged.map(|_| ()).map_err(|e| e.reason()),
            Err("bad_signature")
        );
    }

    // Replacing the keys drops every old one.
    trust.set_keys(&KeySet::default());
    assert_eq!(trust.key_count(), 0);
    assert!(set.keys.iter().all(|k| !trust.has_key(&k.key_id)));
    report
}
