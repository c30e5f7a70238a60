//! `/agentmesh/policy/1`, both directions, and what a member does with a
//! push: the `PolicyPush` a member reads from a router
//! (`agentmesh_wire::policy::decode_push` against the stream reader), the
//! `PolicyAck` a router reads back (`decode_ack`), and the held-policy
//! acceptance (`HeldPolicy::accept`) of the policy a push carries.
//!
//! The first byte picks how the rest is read:
//!
//! - `0`: one whole frame, read as a push and as an ack; a push's policy is
//!   offered to [`held`] policies and the answer checked against
//!   `verify_policy`, `supersedes` and the parser it is made of;
//! - `1`: header `[signer, flags, held]`, then the bytes of a
//!   `PolicyDocument` as the fuzzer wrote them, which the harness signs
//!   with the chosen key ([`crate::keys`]), so the checks behind the
//!   signature are reached;
//! - otherwise: header `[signer, flags, held, epoch, version, issued]`,
//!   then the policy text, from which the harness builds the document (key
//!   id from the signer), so version, epoch and the policy parser are
//!   reached without the fuzzer learning protobuf first.
//!
//! In modes 1 and 2 the push is encoded as a frame (with the fuzzed
//! document and, if `flags & 2`, a signed revocation list) and must decode
//! to itself;
//! then `accept` must agree with a plain model of its rules in order:
//! size, decode, key id, signature (the retired key still verifies a
//! policy), supersedes (same epoch: a higher version; another epoch: issued
//! later), parse.

use std::sync::OnceLock;

use agentmesh_proto::enforce::{HeldPolicy, PolicyRejection};
use agentmesh_proto::identity::ed25519;
use agentmesh_proto::pb::credential::{PolicyDocument, RevocationList, SignedPolicy};
use agentmesh_proto::pb::mesh::{PolicyAck, PolicyPush};
use agentmesh_proto::policy::{MAX_POLICY_DOCUMENT_BYTES, sign_policy, supersedes, verify_policy};
use agentmesh_proto::protocols::{MAX_FRAME_BYTES, MAX_POLICY_FRAME_BYTES};
use agentmesh_proto::revocations::sign_revocations;
use agentmesh_wire::{frame, policy};
use prost::Message;

use crate::Report;
use crate::frames::check;
use crate::keys::{self, CURRENT_KEY_ID, NOW, RETIRED_KEY_ID};

/// The policy text every held policy has (parses: the smallest policy).
pub const HELD_TEXT: &str = "format = 1\n";
/// The epoch and version of the first held policy ([`held`]`()[1]`).
pub const HELD_EPOCH: u64 = 5;
/// See [`HELD_EPOCH`].
pub const HELD_VERSION: u64 = 5;

/// Who signs a document in modes 1 and 2, by the header's first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signer {
    /// The current key, as [`CURRENT_KEY_ID`].
    Current,
    /// The retired key, as [`RETIRED_KEY_ID`] (past its grace: a policy
    /// still verifies).
    Retired,
    /// A key in no key set, claiming to be [`CURRENT_KEY_ID`].
    Stranger,
    /// The current key, naming a key id the trust does not hold.
    UnknownId,
}

impl Signer {
    /// The signer a header byte picks.
    pub fn of(b: u8) -> Self {
        match b % 4 {
            0 => Self::Current,
            1 => Self::Retired,
            2 => Self::Stranger,
            _ => Self::UnknownId,
        }
    }

    /// The key that signs.
    pub fn key(self) -> &'static ed25519::Keypair {
        let k = keys::signing();
        match self {
            Self::Current | Self::UnknownId => &k.current,
            Self::Retired => &k.retired,
            Self::Stranger => &k.stranger,
        }
    }

    /// The key id the document names.
    pub fn key_id(self) -> &'static str {
        match self {
            Self::Current | Self::Stranger => CURRENT_KEY_ID,
            Self::Retired => RETIRED_KEY_ID,
            Self::UnknownId => "unknown",
        }
    }
}

/// A document the current key signs, held as the member's policy.
fn held_policy(epoch: u64, version: u64, issued: i64) -> HeldPolicy {
    let doc = PolicyDocument {
        epoch,
        version,
        issued_at_unix_secs: issued,
        text: HELD_TEXT.into(),
        key_id: CURRENT_KEY_ID.into(),
    };
    let signed = sign_policy(&doc, &keys::signing().current);
    HeldPolicy::accept(&signed, keys::trust(), None).expect("the held policy is accepted")
}

/// What a member may hold when a push arrives: nothing, epoch 5 version 5
/// issued at [`NOW`], or epoch 6 version 1 issued later.
pub fn held() -> &'static [Option<HeldPolicy>; 3] {
    static HELD: OnceLock<[Option<HeldPolicy>; 3]> = OnceLock::new();
    HELD.get_or_init(|| {
        [
            None,
            Some(held_policy(HELD_EPOCH, HELD_VERSION, NOW)),
            Some(held_policy(HELD_EPOCH + 1, 1, NOW + 100)),
        ]
    })
}

/// The ordering fields of a held policy, for the model.
fn held_document(h: &HeldPolicy) -> PolicyDocument {
    PolicyDocument {
        epoch: h.epoch,
        version: h.version,
        issued_at_unix_secs: h.issued_at_unix_secs,
        ..PolicyDocument::default()
    }
}

/// Signs the document bytes as they are (not re-encoded) with `key`.
pub fn sign_document_bytes(document: &[u8], key: &ed25519::Keypair) -> SignedPolicy {
    let mut msg = agentmesh_proto::policy::POLICY_DOMAIN_PREFIX.to_vec();
    msg.extend_from_slice(document);
    SignedPolicy {
        document: document.to_vec(),
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

/// Mode 0: one frame, both ways.
fn frames(data: &[u8], report: &mut Report) {
    match check(data, MAX_POLICY_FRAME_BYTES, policy::decode_push(data)) {
        Ok(push) => {
            report.push("push", "ok");
            if let Some(signed) = &push.policy {
                for h in held() {
                    let got = HeldPolicy::accept(signed, keys::trust(), h.as_ref());
                    report.push("policy", outcome(&got));
                    agrees_with_its_parts(signed, h.as_ref(), &got);
                }
            } else {
                report.push("policy", "absent");
            }
        }
        Err(e) => report.push("push", e),
    }
    match check::<PolicyAck>(data, MAX_FRAME_BYTES, policy::decode_ack(data)) {
        Ok(_) => report.push("ack", "ok"),
        Err(e) => report.push("ack", e),
    }
}

/// Modes 1 and 2: a document the harness signs, in a push.
fn signed(data: &[u8], structured: bool, report: &mut Report) {
    let header = if structured { 6 } else { 3 };
    if data.len() < header {
        report.push("header", "short");
        return;
    }
    let (h, body) = data.split_at(header);
    let (signer, flags, held_at) = (Signer::of(h[0]), h[1], usize::from(h[2] % 3));
    let document = if structured {
        PolicyDocument {
            epoch: u64::from(h[3] % 8),
            version: u64::from(h[4]),
            issued_at_unix_secs: NOW + i64::from(h[5] as i8),
            text: String::from_utf8_lossy(body).into_owned(),
            key_id: signer.key_id().into(),
        }
        .encode_to_vec()
    } else {
        body.to_vec()
    };
    let mut signed = sign_document_bytes(&document, signer.key());
    let tampered = flags & 1 == 1;
    if tampered && let Some(b) = signed.signature.first_mut() {
        *b ^= 0x01;
    }
    let push = PolicyPush {
        policy: Some(signed.clone()),
        revocations: (flags & 2 == 2).then(|| {
            sign_revocations(
                &RevocationList {
                    epoch: HELD_EPOCH,
                    generation: 1,
                    issued_at_unix_secs: NOW,
                    entries: keys::revocations(),
                    key_id: CURRENT_KEY_ID.into(),
                },
                &keys::signing().current,
            )
        }),
    };
    let bytes = frame::encode(&push);
    match policy::decode_push(&bytes) {
        Ok(back) => {
            assert_eq!(back, push, "a push does not survive its own frame");
            report.push("push", "ok");
        }
        // Only a document past the frame's cap may fail to decode.
        Err(e) => {
            assert!(
                bytes.len() > MAX_POLICY_FRAME_BYTES,
                "a push of {} bytes refused: {e}",
                bytes.len()
            );
            report.push("push", crate::frames::label(&e));
            return;
        }
    }
    let held = held()[held_at].as_ref();
    let got = HeldPolicy::accept(&signed, keys::trust(), held);
    report.push("policy", outcome(&got));
    let want = model(&signed.document, signer, tampered, held);
    match (&got, want) {
        (Ok(h), Ok(doc)) => {
            assert_eq!(
                (h.epoch, h.version, h.issued_at_unix_secs),
                (doc.epoch, doc.version, doc.issued_at_unix_secs),
                "accepted with other ordering fields than its document's"
            );
            assert_eq!(h.signed, signed, "held a copy other than the one offered");
        }
        // The model cannot parse policies: a document it would take may
        // still not parse here.
        (Err(PolicyRejection::Unparsable(_)), Ok(_)) => {}
        (Err(e), Err(w)) => assert_eq!(e.reason(), w, "refused for another reason: {e}"),
        (got, want) => panic!("accept gave {:?}, the model {want:?}", outcome(got)),
    }
}

/// What `accept` must answer for `document` signed by `signer` (its
/// signature flipped if `tampered`) with `held` held: the document it
/// takes (then it must still parse), or the refusal's reason.
fn model(
    document: &[u8],
    signer: Signer,
    tampered: bool,
    held: Option<&HeldPolicy>,
) -> Result<PolicyDocument, &'static str> {
    if document.len() > MAX_POLICY_DOCUMENT_BYTES {
        return Err("too_large");
    }
    let doc = PolicyDocument::decode(document).map_err(|_| "malformed")?;
    let Some((trusted, _grace)) = keys::trusted_key(&doc.key_id) else {
        return Err("unknown_key");
    };
    // A policy verifies past its key's grace: the retired key still counts.
    if tampered || trusted != signer.key().public() {
        return Err("bad_signature");
    }
    let held_doc = held.map(held_document);
    let newer = match &held_doc {
        None => true,
        Some(h) if h.epoch == doc.epoch => doc.version > h.version,
        Some(h) => doc.issued_at_unix_secs > h.issued_at_unix_secs,
    };
    if !newer {
        return Err("stale");
    }
    Ok(doc)
}

/// Mode 0 has no model of the signature: `accept` must be exactly its
/// parts, `verify_policy`, then `supersedes`, then the parser.
fn agrees_with_its_parts(
    signed: &SignedPolicy,
    held: Option<&HeldPolicy>,
    got: &Result<HeldPolicy, PolicyRejection>,
) {
    let verified = verify_policy(signed, keys::trust());
    match (got, verified) {
        (Err(PolicyRejection::Verify(e)), Err(v)) => assert_eq!(*e, v),
        (Err(PolicyRejection::Verify(e)), Ok(_)) => {
            panic!("accept refused a policy that verifies: {e}")
        }
        (_, Err(v)) => panic!("accept went past a failed verification ({v:?})"),
        (Err(PolicyRejection::Stale { epoch, version }), Ok(doc)) => {
            assert_eq!((*epoch, *version), (doc.epoch, doc.version));
            assert!(!supersedes(&doc, held.map(held_document).as_ref()));
        }
        (Err(PolicyRejection::Unparsable(_)), Ok(doc)) => {
            assert!(supersedes(&doc, held.map(held_document).as_ref()));
        }
        (Ok(h), Ok(doc)) => {
            assert!(supersedes(&doc, held.map(held_document).as_ref()));
            assert_eq!((h.epoch, h.version), (doc.epoch, doc.version));
        }
    }
}

/// The outcome label of one acceptance.
fn outcome(got: &Result<HeldPolicy, PolicyRejection>) -> &'static str {
    match got {
        Ok(_) => "accepted",
        Err(e) => e.reason(),
    }
}
