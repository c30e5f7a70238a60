//! The proof of possession the control plane checks on Enroll, Refresh,
//! RouterLease and Watch (`proof::verify_proof`, pure: no I/O), bound to
//! the request it travels in.
//!
//! Input: `flags: u8`, `key: u8`, `moved: u8`, `ts: i64`, `now: i64`, then
//! the body. Mode `Structured`: the harness builds its own request of the
//! signed purpose, makes a proof for it with a fixed member key over the
//! body as the endpoint URL at `ts` (`Bound::proven`, or the old v1 format
//! as an older program made it), maybe breaks it (signature flipped,
//! emptied or cut; public key cut), and checks it at `ts + now` on the
//! request of the verified purpose with one field maybe moved (another
//! token, credential, addresses, labels, load or draining flag), against a
//! model: a proof verifies only for the very request it was made for. Mode
//! `Request`: the body is an encoded request of the verified purpose as a
//! gRPC peer sends it, checked at `now` for [`CP_URL`]; a refresh's,
//! lease's or watch's credential must then name the prover; and a proof
//! that verified must fail once the moved field changes, if the request
//! carries that field.

use agentmesh_proto::identity::{Keypair, PeerId, PublicKey};
use agentmesh_proto::pb::controlplane::{
    EnrollRequest, ProofOfPossession, RefreshRequest, RouterLeaseRequest, RouterLoad, WatchRequest,
};
use agentmesh_proto::pb::credential::{Credential, Label, Role};
use agentmesh_proto::proof::{
    Binding, Bound, MAX_PROOF_AGE_SECS, ProofError, Purpose, make_proof, normalize_url,
    verify_proof,
};
use prost::Message;

use crate::Report;
use crate::input::{Reader, Writer};
use crate::keys;
use crate::targets::credential;

/// The endpoint the control plane signs as, in request mode.
pub const CP_URL: &str = "http://cp.test:7400";

/// What the body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The endpoint URL a proof made by the harness signs.
    Structured,
    /// An encoded request of the verified purpose.
    Request,
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

/// The field changed between the request proven and the one verified (a
/// proof seen in flight, moved onto another request). A request without
/// that field is left as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// None: the proof checked on its own request.
    None,
    /// Enroll's token: another one.
    Token,
    /// The credential: other claims (or one where there was none).
    Credential,
    /// RouterLease's addresses: one more.
    Addrs,
    /// RouterLease's labels: one more.
    Labels,
    /// RouterLease's load: one more attached member (a load where there was none).
    Load,
    /// RouterLease's load there or not: the other.
    LoadPresence,
    /// RouterLease's draining flag: the other.
    Draining,
}

const FIELDS: [Field; 8] = [
    Field::None,
    Field::Token,
    Field::Credential,
    Field::Addrs,
    Field::Labels,
    Field::Load,
    Field::LoadPresence,
    Field::Draining,
];

/// Whether a request of `purpose` carries `field`, so its proof is bound
/// to it: the model of what each proof covers.
pub fn covers(purpose: Purpose, field: Field) -> bool {
    match (purpose, field) {
        (_, Field::None) => false,
        (Purpose::Enroll, f) => f == Field::Token,
        (Purpose::Refresh | Purpose::Watch, f) => f == Field::Credential,
        (Purpose::Lease, f) => f != Field::Token,
    }
}

/// One proof case, as the input encodes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// What the body is.
    pub mode: Mode,
    /// The purpose signed (structured mode).
    pub signed: Purpose,
    /// The purpose verified (and in request mode, the body's request).
    pub verified: Purpose,
    /// How the signature is broken.
    pub breakage: Breakage,
    /// Which member key signs (`keys::peers()[key % 4]`).
    pub key: u8,
    /// The public key's last byte is cut (it no longer decodes).
    pub cut_key: bool,
    /// The URL the verifier checks against.
    pub verifier: Verifier,
    /// The field moved before the check.
    pub moved: Field,
    /// The harness signs in the old, unbound v1 format (structured mode).
    pub old_format: bool,
    /// The proof's timestamp.
    pub ts: i64,
    /// The verifier's clock: `ts + now` in structured mode, else absolute.
    pub now: i64,
    /// The URL or the encoded request.
    pub body: Vec<u8>,
}

const PURPOSES: [Purpose; 4] = [
    Purpose::Enroll,
    Purpose::Refresh,
    Purpose::Lease,
    Purpose::Watch,
];

fn index<T: PartialEq>(all: &[T], x: &T) -> u8 {
    all.iter().position(|y| y == x).unwrap_or(0) as u8
}

impl Case {
    /// A structured case: an Enroll proof for `url` at `ts`, checked at
    /// `ts + delta`.
    pub fn structured(url: &str, ts: i64, delta: i64) -> Self {
        Self {
            mode: Mode::Structured,
            signed: Purpose::Enroll,
            verified: Purpose::Enroll,
            breakage: Breakage::None,
            key: 0,
            cut_key: false,
            verifier: Verifier::Same,
            moved: Field::None,
            old_format: false,
            ts,
            now: delta,
            body: url.as_bytes().to_vec(),
        }
    }

    /// A request case: `body` is the encoded request of `verified`,
    /// checked at `now`.
    pub fn request(verified: Purpose, now: i64, body: Vec<u8>) -> Self {
        Self {
            mode: Mode::Request,
            verified,
            now,
            body,
            ..Self::structured("", 0, 0)
        }
    }

    /// The input bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mode = u8::from(self.mode == Mode::Request);
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
            | index(&PURPOSES, &self.signed) << 2
            | index(&PURPOSES, &self.verified) << 4
            | breakage << 6;
        let key = (self.key & 3) | u8::from(self.cut_key) << 2 | verifier << 3;
        let moved = index(&FIELDS, &self.moved) | u8::from(self.old_format) << 3;
        Writer::new()
            .u8(flags)
            .u8(key)
            .u8(moved)
            .i64(self.ts)
            .i64(self.now)
            .bytes(&self.body)
            .finish()
    }

    /// Reads a case from any input.
    pub fn parse(data: &[u8]) -> Self {
        let mut r = Reader::new(data);
        let (flags, key, moved) = (r.u8(), r.u8(), r.u8());
        let (ts, now) = (r.i64(), r.i64());
        Self {
            mode: if flags & 3 == 0 {
                Mode::Structured
            } else {
                Mode::Request
            },
            signed: PURPOSES[usize::from((flags >> 2) & 3)],
            verified: PURPOSES[usize::from((flags >> 4) & 3)],
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
            moved: FIELDS[usize::from(moved & 7)],
            old_format: moved & 8 != 0,
            ts,
            now,
            body: r.rest().to_vec(),
        }
    }
}

/// A request of any purpose.
#[derive(Debug, Clone, PartialEq)]
pub enum Req {
    /// `Enroll`.
    Enroll(EnrollRequest),
    /// `Refresh`.
    Refresh(RefreshRequest),
    /// `RouterLease`.
    Lease(RouterLeaseRequest),
    /// `Watch`.
    Watch(WatchRequest),
}

impl Req {
    /// The harness's own request of `purpose`, for member `key`.
    pub fn fixed(purpose: Purpose, key: u8) -> Self {
        let i = usize::from(key);
        let role = if purpose == Purpose::Lease || purpose == Purpose::Watch {
            Role::Router
        } else {
            Role::Member
        };
        let credential = Some(keys::member_credential(i, role));
        match purpose {
            Purpose::Enroll => Self::Enroll(EnrollRequest {
                token: "amt_fuzz_token".into(),
                proof: None,
            }),
            Purpose::Refresh => Self::Refresh(RefreshRequest {
                credential,
                proof: None,
            }),
            Purpose::Watch => Self::Watch(WatchRequest {
                credential,
                proof: None,
            }),
            Purpose::Lease => Self::Lease(RouterLeaseRequest {
                credential,
                proof: None,
                addrs: vec!["/ip4/127.0.0.1/tcp/4001".into()],
                labels: vec![Label {
                    key: "team".into(),
                    value: "fuzz".into(),
                }],
                load: Some(RouterLoad {
                    attached_members: 3,
                    transit_connections: 1,
                    high_watermark: 100,
                    low_watermark: 85,
                }),
                draining: false,
            }),
        }
    }

    /// `body` decoded as the request of `purpose`.
    pub fn decode(purpose: Purpose, body: &[u8]) -> Option<Self> {
        Some(match purpose {
            Purpose::Enroll => Self::Enroll(EnrollRequest::decode(body).ok()?),
            Purpose::Refresh => Self::Refresh(RefreshRequest::decode(body).ok()?),
            Purpose::Lease => Self::Lease(RouterLeaseRequest::decode(body).ok()?),
            Purpose::Watch => Self::Watch(WatchRequest::decode(body).ok()?),
        })
    }

    /// The encoded request.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Self::Enroll(r) => r.encode_to_vec(),
            Self::Refresh(r) => r.encode_to_vec(),
            Self::Lease(r) => r.encode_to_vec(),
            Self::Watch(r) => r.encode_to_vec(),
        }
    }

    /// The binding of its fields.
    pub fn binding(&self) -> Binding {
        match self {
            Self::Enroll(r) => r.binding(),
            Self::Refresh(r) => r.binding(),
            Self::Lease(r) => r.binding(),
            Self::Watch(r) => r.binding(),
        }
    }

    /// The proof it carries.
    pub fn proof(&self) -> Option<&ProofOfPossession> {
        match self {
            Self::Enroll(r) => r.proof.as_ref(),
            Self::Refresh(r) => r.proof.as_ref(),
            Self::Lease(r) => r.proof.as_ref(),
            Self::Watch(r) => r.proof.as_ref(),
        }
    }

    /// The request with a proof by `key` at `ts` for `url`.
    pub fn proven(self, url: &str, key: &Keypair, ts: i64) -> Self {
        match self {
            Self::Enroll(r) => Self::Enroll(r.proven(url, key, ts)),
            Self::Refresh(r) => Self::Refresh(r.proven(url, key, ts)),
            Self::Lease(r) => Self::Lease(r.proven(url, key, ts)),
            Self::Watch(r) => Self::Watch(r.proven(url, key, ts)),
        }
    }

    fn credential(&self) -> Option<&Credential> {
        match self {
            Self::Enroll(_) => None,
            Self::Refresh(r) => r.credential.as_ref(),
            Self::Lease(r) => r.credential.as_ref(),
            Self::Watch(r) => r.credential.as_ref(),
        }
    }

    /// Changes `field`, if the request carries it, to another value.
    pub fn move_field(&mut self, field: Field) {
        let other_credential = |c: &mut Option<Credential>| match c {
            Some(c) => c.claims.push(0),
            None => *c = Some(Credential::default()),
        };
        match (self, field) {
            (Self::Enroll(r), Field::Token) => r.token.push('x'),
            (Self::Refresh(r), Field::Credential) => other_credential(&mut r.credential),
            (Self::Watch(r), Field::Credential) => other_credential(&mut r.credential),
            (Self::Lease(r), f) => match f {
                Field::Credential => other_credential(&mut r.credential),
                Field::Addrs => r.addrs.push("/ip4/192.0.2.66/tcp/1".into()),
                Field::Labels => r.labels.push(Label::default()),
                Field::Load => {
                    let load = r.load.get_or_insert_with(RouterLoad::default);
                    load.attached_members = load.attached_members.wrapping_add(1);
                }
                Field::LoadPresence => {
                    r.load = match r.load {
                        Some(_) => None,
                        None => Some(RouterLoad::default()),
                    }
                }
                Field::Draining => r.draining = !r.draining,
                Field::None | Field::Token => {}
            },
            _ => {}
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
        Err(ProofError::OldFormat) => "old_format",
    }
}

/// Runs one input.
pub fn run(data: &[u8]) -> Report {
    let case = Case::parse(data);
    let mut report = Report::default();
    match case.mode {
        Mode::Structured => structured(&case, &mut report),
        Mode::Request => match Req::decode(case.verified, &case.body) {
            Some(req) => {
                report.push("decode", "ok");
                requested(&case, &req, &mut report);
            }
            None => report.push("decode", "malformed"),
        },
    }
    report
}

/// The bytes an older program signed (format v1: no binding), written
/// here from its description, not taken from the verifier.
fn v1_message(purpose: Purpose, url: &str, peer: &PeerId, ts: i64) -> Vec<u8> {
    let name = match purpose {
        Purpose::Enroll => "enroll",
        Purpose::Refresh => "refresh",
        Purpose::Lease => "lease",
        Purpose::Watch => "watch",
    };
    let url = normalize_url(url);
    let peer = peer.to_bytes();
    let mut m = format!("agentmesh {name} v1\0").into_bytes();
    m.extend_from_slice(&(url.len() as u32).to_be_bytes());
    m.extend_from_slice(url.as_bytes());
    m.extend_from_slice(&(peer.len() as u32).to_be_bytes());
    m.extend_from_slice(&peer);
    m.extend_from_slice(&ts.to_be_bytes());
    m
}

/// A proof made by the harness, maybe broken, maybe moved, against the
/// model.
fn structured(case: &Case, report: &mut Report) {
    let url = String::from_utf8_lossy(&case.body);
    let key = &keys::peers()[usize::from(case.key)];
    let signed = Req::fixed(case.signed, case.key);
    let mut p = if case.old_format {
        let msg = v1_message(case.signed, &url, &key.public().to_peer_id(), case.ts);
        ProofOfPossession {
            public_key: key.public().encode_protobuf(),
            timestamp_unix_secs: case.ts,
            signature: key.sign(&msg).unwrap_or_default(),
        }
    } else {
        make_proof(&signed.binding(), &url, key, case.ts)
    };
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
    let mut verified = Req::fixed(case.verified, case.key);
    verified.move_field(case.moved);
    let now = case.ts.saturating_add(case.now);
    let got = verify_proof(&verified.binding(), &verifier_url, &p, now);
    // The rules: a key that decodes, a timestamp within the age bound, then
    // an intact signature for this purpose and this endpoint, over this
    // very request (v2), or over no request at all (v1: refused as old).
    let intact = case.breakage == Breakage::None
        && case.signed == case.verified
        && normalize_url(&url) == normalize_url(&verifier_url);
    let want = if case.cut_key {
        "bad_key"
    } else if (i128::from(now) - i128::from(case.ts)).abs() > i128::from(MAX_PROOF_AGE_SECS) {
        "stale"
    } else if intact && case.old_format {
        "old_format"
    } else if intact && !covers(case.verified, case.moved) {
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

/// A request a peer sent: its proof checked at `now` for [`CP_URL`], its
/// credential against the prover, then its proof on the request with the
/// moved field.
fn requested(case: &Case, req: &Req, report: &mut Report) {
    let Some(p) = req.proof() else {
        report.push("proof", "missing");
        return;
    };
    let got = verify_proof(&req.binding(), CP_URL, p, case.now);
    report.push("proof", label(&got));
    let Ok((key, peer)) = got else {
        return;
    };
    // Accepted: the key is the one in the proof, the time within bounds.
    assert_eq!(
        PublicKey::try_decode_protobuf(&p.public_key).ok(),
        Some(key)
    );
    assert!(case.now.abs_diff(p.timestamp_unix_secs) <= MAX_PROOF_AGE_SECS.unsigned_abs());
    if let Some(cred) = req.credential() {
        let outcome = credential::check(
            cred,
            keys::trust(),
            case.now,
            Some(&peer),
            keys::SKEW_SECS,
            &keys::revoked_until,
        );
        report.push("credential", outcome);
    }
    if case.moved == Field::None {
        return;
    }
    let mut other = req.clone();
    other.move_field(case.moved);
    let moved = label(&verify_proof(&other.binding(), CP_URL, p, case.now));
    let want = if covers(case.verified, case.moved) {
        "bad_signature"
    } else {
        "ok"
    };
    assert_eq!(moved, want, "the proof moved onto {:?}", case.moved);
    report.push("moved", moved);
}
