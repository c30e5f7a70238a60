//! The proof of possession the control plane checks on Enroll, Refresh and
//! RouterLease (`proof::verify_proof`, pure: no I/O).
//!
//! Input: `flags: u8`, `key: u8`, `ts: i64`, `now: i64`, then the body.
//! Mode `STRUCTURED`: the harness makes a proof with a fixed member key
//! over the body as the endpoint URL at `ts` (`make_proof`), maybe breaks
//! it (signature flipped, emptied or cut; public key cut; another purpose
//! or URL at the verifier), and checks it at `ts + now` against a model.
//! Other modes: the body is an encoded `EnrollRequest`, `RefreshRequest` or
//! `RouterLeaseRequest` as a gRPC peer sends it, checked at `now` for
//! [`CP_URL`]; a refresh's or lease's credential must then name the
//! prover.

use agentmesh_proto::identity::{PeerId, PublicKey};
use agentmesh_proto::pb::controlplane::{
    EnrollRequest, ProofOfPossession, RefreshRequest, RouterLeaseRequest,
};
use agentmesh_proto::proof::{
    MAX_PROOF_AGE_SECS, ProofError, Purpose, make_proof, normalize_url, verify_proof,
};
use prost::Message;

use crate::Report;
use crate::input::{Reader, Writer};
use crate::keys;
use crate::targets::credential;

/// The endpoint the control plane signs as, in the request modes.
pub const CP_URL: &str = "http://cp.test:7400";

/// What the body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The endpoint URL a proof made by the harness signs.
    Structured,
    /// An encoded `EnrollRequest`.
    Enroll,
    /// An encoded `RefreshRequest`.
    Refresh,
    /// An encoded `RouterLeaseRequest`.
    Lease,
}

/// How the harness breaks the proof it made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breakage {
    /// Not at all.
    None,
    /// One bit of the signature flipped.
    Flipped,
    /// No signature.
    Empty,
    /// The signature's last byte cut.
    Cut,
}

/// The URL the verifier checks against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verifier {
    /// The one signed.
    Same,
    /// The one signed plus a trailing slash (the same endpoint).
    Slash,
    /// The one signed plus a letter (another endpoint).
    Other,
    /// [`CP_URL`].
    Fixed,
}

/// One proof case, as the input encodes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// What the body is.
    pub mode: Mode,
    /// The purpose signed (structured mode).
    pub signed: Purpose,
    /// The purpose verified.
    pub verified: Purpose,
    /// How the signature is broken.
    pub breakage: Breakage,
    /// Which member key signs (`keys::peers()[key % 4]`).
    pub key: u8,
    /// The public key's last byte is cut (it no longer decodes).
    pub cut_key: bool,
    /// The URL the verifier checks against.
    pub verifier: Verifier,
    /// The proof's timestamp.
    pub ts: i64,
    /// The verifier's clock: `ts + now` in structured mode, else absolute.
    pub now: i64,
    /// The URL or the encoded request.
    pub body: Vec<u8>,
}

fn purpose(bits: u8) -> Purpose {
    match bits % 4 {
        0 => Purpose::Enroll,
        1 => Purpose::Refresh,
        2 => Purpose::Lease,
        _ => Purpose::Watch,
    }
}

fn purpose_bits(p: Purpose) -> u8 {
    match p {
        Purpose::Enroll => 0,
        Purpose::Refresh => 1,
        Purpose::Lease => 2,
        Purpose::Watch => 3,
    }
}

impl Case {
    /// A structured case: a proof for `url` at `ts`, checked at `ts + delta`.
    pub fn structured(url: &str, ts: i64, delta: i64) -> Self {
        Self {
            mode: Mode::Structured,
            signed: Purpose::Enroll,
            verified: Purpose::Enroll,
            breakage: Breakage::None,
            key: 0,
            cut_key: false,
            verifier: Verifier::Same,
            ts,
            now: delta,
            body: url.as_bytes().to_vec(),
        }
    }

    /// A request case: `body` is the encoded request of `mode`, checked at `now`.
    pub fn request(mode: Mode, verified: Purpose, now: i64, body: Vec<u8>) -> Self {
        Self {
            mode,
            verified,
            now,
            body,
            ..Self::structured("", 0, 0)
        }
    }

    /// The input bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mode = match self.mode {
            Mode::Structured => 0,
            Mode::Enroll => 1,
            Mode::Refresh => 2,
            Mode::Lease => 3,
        };
        let breakage = match self.breakage {
            Breakage::None => 0,
            Breakage::Flipped => 1,
            Breakage::Empty => 2,
            Breakage::Cut => 3,
        };
        let verifier = match self.verifier {
            Verifier::Same => 0,
            Verifier::Slash => 1,
            Verifier::Other => 2,
            Verifier::Fixed => 3,
        };
        let flags = mode
            | purpose_bits(self.signed) << 2
            | purpose_bits(self.verified) << 4
            | breakage << 6;
        let key = (self.key & 3) | u8::from(self.cut_key) << 2 | verifier << 3;
        Writer::new()
            .u8(flags)
            .u8(key)
            .i64(self.ts)
            .i64(self.now)
            .bytes(&self.body)
            .finish()
    }

    /// Reads a case from any input.
    pub fn parse(data: &[u8]) -> Self {
        let mut r = Reader::new(data);
        let (flags, key) = (r.u8(), r.u8());
        let (ts, now) = (r.i64(), r.i64());
        Self {
            mode: match flags & 3 {
                0 => Mode::Structured,
                1 => Mode::Enroll,
                2 => Mode::Refresh,
                _ => Mode::Lease,
            },
            signed: purpose((flags >> 2) & 3),
            verified: purpose((flags >> 4) & 3),
            breakage: match flags >> 6 {
                0 => Breakage::None,
                1 => Breakage::Flipped,
                2 => Breakage::Empty,
                _ => Breakage::Cut,
            },
            key: key & 3,
            cut_key: key & 4 != 0,
            verifier: match (key >> 3) & 3 {
                0 => Verifier::Same,
                1 => Verifier::Slash,
                2 => Verifier::Other,
                _ => Verifier::Fixed,
            },
            ts,
            now,
            body: r.rest().to_vec(),
        }
    }
}

/// A short label for a proof refusal.
pub fn label(r: &Result<(PublicKey, PeerId), ProofError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(ProofError::BadKey) => "bad_key",
        Err(ProofError::Stale { .. }) => "stale",
        Err(ProofError::BadSignature) => "bad_signature",
    }
}

/// Runs one input.
pub fn run(data: &[u8]) -> Report {
    let case = Case::parse(data);
    let mut report = Report::default();
    match case.mode {
        Mode::Structured => structured(&case, &mut report),
        Mode::Enroll => match EnrollRequest::decode(case.body.as_slice()) {
            Ok(req) => {
                report.push("decode", "ok");
                proof(&case, req.proof.as_ref(), &mut report);
            }
            Err(_) => report.push("decode", "malformed"),
        },
        Mode::Refresh => match RefreshRequest::decode(case.body.as_slice()) {
            Ok(req) => {
                report.push("decode", "ok");
                let peer = proof(&case, req.proof.as_ref(), &mut report);
                held(&case, req.credential.as_ref(), peer, &mut report);
            }
            Err(_) => report.push("decode", "malformed"),
        },
        Mode::Lease => match RouterLeaseRequest::decode(case.body.as_slice()) {
            Ok(req) => {
                report.push("decode", "ok");
                let peer = proof(&case, req.proof.as_ref(), &mut report);
                held(&case, req.credential.as_ref(), peer, &mut report);
            }
            Err(_) => report.push("decode", "malformed"),
        },
    }
    report
}

/// A proof made by the harness, maybe broken, against the model.
fn structured(case: &Case, report: &mut Report) {
    let url = String::from_utf8_lossy(&case.body);
    let key = &keys::peers()[usize::from(case.key)];
    let mut p = make_proof(case.signed, &url, key, case.ts);
    match case.breakage {
        Breakage::None => {}
        Breakage::Flipped => {
            let at = usize::from(case.key) * 16 + 3;
            p.signature[at] ^= 0x10;
        }
        Breakage::Empty => p.signature.clear(),
        Breakage::Cut => {
            p.signature.pop();
        }
    }
    if case.cut_key {
        p.public_key.pop();
    }
    let verifier_url = match case.verifier {
        Verifier::Same => url.to_string(),
        Verifier::Slash => format!("{url}/"),
        Verifier::Other => format!("{url}x"),
        Verifier::Fixed => CP_URL.to_string(),
    };
    let now = case.ts.saturating_add(case.now);
    let got = verify_proof(case.verified, &verifier_url, &p, now);
    // The rules: a key that decodes, a timestamp within the age bound, then
    // an intact signature for this purpose and this endpoint.
    let want = if case.cut_key {
        "bad_key"
    } else if (i128::from(now) - i128::from(case.ts)).abs() > i128::from(MAX_PROOF_AGE_SECS) {
        "stale"
    } else if case.breakage == Breakage::None
        && case.signed == case.verified
        && normalize_url(&url) == normalize_url(&verifier_url)
    {
        "ok"
    } else {
        "bad_signature"
    };
    assert_eq!(label(&got), want, "verify_proof: {got:?}");
    if let Ok((k, peer)) = &got {
        assert_eq!(*k, key.public());
        assert_eq!(*peer, key.public().to_peer_id());
    }
    if let Err(ProofError::Stale { ts, now: n }) = got {
        assert_eq!((ts, n), (case.ts, now));
    }
    report.push("proof", want);
}

/// A proof a peer sent: checked at `now` for [`CP_URL`]; returns the prover.
fn proof(case: &Case, p: Option<&ProofOfPossession>, report: &mut Report) -> Option<PeerId> {
    let Some(p) = p else {
        report.push("proof", "missing");
        return None;
    };
    let got = verify_proof(case.verified, CP_URL, p, case.now);
    report.push("proof", label(&got));
    let (key, peer) = got.ok()?;
    // Accepted: the key is the one in the proof, the time within bounds.
    assert_eq!(
        PublicKey::try_decode_protobuf(&p.public_key).ok(),
        Some(key)
    );
    assert!(case.now.abs_diff(p.timestamp_unix_secs) <= MAX_PROOF_AGE_SECS.unsigned_abs());
    Some(peer)
}

/// The credential of a refresh or lease: it must name the prover.
fn held(
    case: &Case,
    cred: Option<&agentmesh_proto::pb::credential::Credential>,
    prover: Option<PeerId>,
    report: &mut Report,
) {
    let (Some(cred), Some(prover)) = (cred, prover) else {
        return;
    };
    let outcome = credential::check(
        cred,
        keys::trust(),
        case.now,
        Some(&prover),
        keys::SKEW_SECS,
        &keys::revoked_until,
    );
    report.push("credential", outcome);
}
