//! The signed revocation list a member (or router) is offered, against a
//! model of its rules: `HeldRevocations::accept` for a member (a list of
//! the generation held is refused) and for a router (the generation held,
//! signed again later after a key rotation, is taken), and
//! `verify_revocations` under it.
//!
//! The first byte picks how the rest is read:
//!
//! - `0`: one whole `PolicyPush` frame (`agentmesh_wire::policy::decode_push`
//!   against the stream reader); its list is offered to every [`held`] list
//!   both ways and the answer checked against `verify_revocations`,
//!   `supersedes` and the same-generation rule it is made of;
//! - `1`: header `[signer, flags, held]`, then the bytes of a
//!   `RevocationList` as the fuzzer wrote them, which the harness signs with
//!   the chosen key ([`crate::keys`]), so the checks behind the signature
//!   are reached;
//! - otherwise: header `[signer, flags, held, epoch, generation, issued]`,
//!   then a token id, from which the harness builds a one-entry list (key
//!   id from the signer), so generation, epoch and issue time are reached
//!   without the fuzzer learning protobuf first.
//!
//! Flags: `1` flips a signature bit; `2` checks at the end of the retired
//! key's grace instead of [`NOW`] (past it).
//!
//! The model, in order: size, decode, key id known, signature, key within
//! its grace, then supersedes (same epoch: a higher generation; another
//! epoch: issued later), or for a router the generation held issued later.

use std::sync::OnceLock;

use agentmesh_proto::identity::ed25519;
use agentmesh_proto::pb::credential::{Revocation, RevocationList, SignedRevocations};
use agentmesh_proto::protocols::MAX_POLICY_FRAME_BYTES;
use agentmesh_proto::revocations::{
    HeldRevocations, ListOrder, MAX_REVOCATIONS_LIST_BYTES, REVOCATIONS_DOMAIN_PREFIX,
    RevocationsRejection, SameGeneration, sign_revocations, supersedes, verify_revocations,
};
use agentmesh_wire::policy;
use prost::Message;

use crate::Report;
use crate::frames::check;
use crate::keys::{self, CURRENT_KEY_ID, NOW, RETIRED_UNTIL};
use crate::targets::policy_frames::Signer;

/// The epoch and generation of the first held list ([`held`]`()[1]`).
pub const HELD_EPOCH: u64 = 5;
/// See [`HELD_EPOCH`].
pub const HELD_GENERATION: u64 = 5;

/// Both ways a holder takes a list: a member, then a router.
const HOLDERS: [SameGeneration; 2] = [SameGeneration::Refuse, SameGeneration::TakeResigned];

/// A list the current key signs, held.
fn held_list(epoch: u64, generation: u64, issued: i64) -> HeldRevocations {
    let list = RevocationList {
        epoch,
        generation,
        issued_at_unix_secs: issued,
        entries: keys::revocations(),
        key_id: CURRENT_KEY_ID.into(),
    };
    let signed = sign_revocations(&list, &keys::signing().current);
    HeldRevocations::accept(&signed, keys::trust(), None, NOW, SameGeneration::Refuse)
        .expect("the held list is accepted")
}

/// What a holder may hold when a list arrives: nothing, epoch 5
/// generation 5 issued at [`NOW`], or epoch 6 generation 1 issued later.
pub fn held() -> &'static [Option<HeldRevocations>; 3] {
    static HELD: OnceLock<[Option<HeldRevocations>; 3]> = OnceLock::new();
    HELD.get_or_init(|| {
        [
            None,
            Some(held_list(HELD_EPOCH, HELD_GENERATION, NOW)),
            Some(held_list(HELD_EPOCH + 1, 1, NOW + 100)),
        ]
    })
}

/// Signs the list bytes as they are (not re-encoded) with `key`.
pub fn sign_list_bytes(list: &[u8], key: &ed25519::Keypair) -> SignedRevocations {
    let mut msg = REVOCATIONS_DOMAIN_PREFIX.to_vec();
    msg.extend_from_slice(list);
    SignedRevocations {
        list: list.to_vec(),
        signature: key.sign(&msg),
    }
}

/// Runs one input.
pub fn run(data: &[u8]) -> Report {
    let mut report = Report::default();
    match data.split_first() {
        None => report.push("mode", "empty"),
        Some((0, frame)) => frames(frame, &mut report),
        Some((1, rest)) => signed(rest, false, &mut report),
        Some((_, rest)) => signed(rest, true, &mut report),
    }
    report
}

/// Mode 0: a push frame; its list offered to every holder.
fn frames(data: &[u8], report: &mut Report) {
    let push = match check(data, MAX_POLICY_FRAME_BYTES, policy::decode_push(data)) {
        Ok(push) => push,
        Err(e) => return report.push("push", e),
    };
    report.push("push", "ok");
    let Some(list) = &push.revocations else {
        return report.push("list", "absent");
    };
    for h in held() {
        for same in HOLDERS {
            let got = HeldRevocations::accept(list, keys::trust(), h.as_ref(), NOW, same);
            report.push("list", outcome(&got));
            agrees_with_its_parts(list, h.as_ref(), same, &got);
        }
    }
}

/// Modes 1 and 2: a list the harness signs.
fn signed(data: &[u8], structured: bool, report: &mut Report) {
    let header = if structured { 6 } else { 3 };
    if data.len() < header {
        return report.push("header", "short");
    }
    let (h, body) = data.split_at(header);
    let (signer, flags, held_at) = (Signer::of(h[0]), h[1], usize::from(h[2] % 3));
    let bytes = if structured {
        RevocationList {
            epoch: u64::from(h[3] % 8),
            generation: u64::from(h[4]),
            issued_at_unix_secs: NOW + i64::from(h[5] as i8),
            entries: vec![Revocation {
                peer_id: Vec::new(),
                until_unix_secs: NOW + 60,
                reason: "fuzz".into(),
                token_id: String::from_utf8_lossy(body).into_owned(),
            }],
            key_id: signer.key_id().into(),
        }
        .encode_to_vec()
    } else {
        body.to_vec()
    };
    let mut signed = sign_list_bytes(&bytes, signer.key());
    let tampered = flags & 1 == 1;
    if tampered && let Some(b) = signed.signature.first_mut() {
        *b ^= 0x01;
    }
    let now = if flags & 2 == 2 { RETIRED_UNTIL } else { NOW };
    let held = held()[held_at].as_ref();
    for same in HOLDERS {
        let got = HeldRevocations::accept(&signed, keys::trust(), held, now, same);
        report.push("list", outcome(&got));
        let want = model(&signed.list, signer, tampered, held, now, same);
        match (&got, want) {
            (Ok(h), Ok(list)) => {
                assert_eq!(h.order, ListOrder::from(&list), "other ordering fields");
                assert_eq!(*h.entries, list.entries, "other entries than its list's");
                assert_eq!(h.signed, signed, "held a copy other than the one offered");
            }
            (Err(e), Err(w)) => assert_eq!(e.reason(), w, "refused for another reason: {e}"),
            (got, want) => panic!("accept gave {:?}, the model {want:?}", outcome(got)),
        }
    }
}

/// What `accept` must answer for `list` signed by `signer` (its signature
/// flipped if `tampered`) at `now` with `held` held.
fn model(
    list: &[u8],
    signer: Signer,
    tampered: bool,
    held: Option<&HeldRevocations>,
    now: i64,
    same: SameGeneration,
) -> Result<RevocationList, &'static str> {
    if list.len() > MAX_REVOCATIONS_LIST_BYTES {
        return Err("too_large");
    }
    let doc = RevocationList::decode(list).map_err(|_| "malformed")?;
    let Some((trusted, grace)) = keys::trusted_key(&doc.key_id) else {
        return Err("unknown_key");
    };
    if tampered || trusted != signer.key().public() {
        return Err("bad_signature");
    }
    // Unlike a policy, a list needs its key within its grace.
    if grace != 0 && now > grace {
        return Err("key_retired");
    }
    let newer = match held.map(|h| h.order) {
        None => true,
        Some(h) if h.epoch == doc.epoch && h.generation == doc.generation => {
            same == SameGeneration::TakeResigned && doc.issued_at_unix_secs > h.issued_at_unix_secs
        }
        Some(h) if h.epoch == doc.epoch => doc.generation > h.generation,
        Some(h) => doc.issued_at_unix_secs > h.issued_at_unix_secs,
    };
    if !newer {
        return Err("stale");
    }
    Ok(doc)
}

/// Mode 0 has no model of the signature: `accept` must be exactly its
/// parts, `verify_revocations`, then `supersedes` (or, for a router, the
/// generation held issued later).
fn agrees_with_its_parts(
    signed: &SignedRevocations,
    held: Option<&HeldRevocations>,
    same: SameGeneration,
    got: &Result<HeldRevocations, RevocationsRejection>,
) {
    let verified = verify_revocations(signed, keys::trust(), NOW);
    let takes = |list: &RevocationList| {
        let order = ListOrder::from(list);
        supersedes(order, held.map(|h| h.order))
            || (same == SameGeneration::TakeResigned
                && held.is_some_and(|h| {
                    (h.order.epoch, h.order.generation) == (order.epoch, order.generation)
                        && order.issued_at_unix_secs > h.order.issued_at_unix_secs
                }))
    };
    match (got, verified) {
        (Err(RevocationsRejection::Verify(e)), Err(v)) => assert_eq!(*e, v),
        (Err(RevocationsRejection::Verify(e)), Ok(_)) => {
            panic!("accept refused a list that verifies: {e}")
        }
        (_, Err(v)) => panic!("accept went past a failed verification ({v:?})"),
        (Err(RevocationsRejection::Stale { epoch, generation }), Ok(list)) => {
            assert_eq!((*epoch, *generation), (list.epoch, list.generation));
            assert!(!takes(&list));
        }
        (Ok(h), Ok(list)) => {
            assert!(takes(&list));
            assert_eq!(h.order, ListOrder::from(&list));
        }
    }
}

/// The outcome label of one acceptance.
fn outcome(got: &Result<HeldRevocations, RevocationsRejection>) -> &'static str {
    match got {
        Ok(_) => "accepted",
        Err(e) => e.reason(),
    }
}
