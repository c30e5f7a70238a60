//! `record::verify_record` on service records the fuzzer writes and the
//! harness signs with a member's key, against a model of the rules.
//!
//! Input: `flags: u8`, `now: i64`, then the body: `ServiceRecord` bytes to
//! sign as they are, or (flag `RAW`) a whole encoded `SignedRecord`. The
//! flags pick the signer (`keys::peers()[0]` or `[1]`, or `[0]` with a bit
//! flipped, or no signature) and whether `now` counts from the record's
//! expiry.

use agentmesh_proto::identity::{Keypair, PeerId, PublicKey};
use agentmesh_proto::pb::mesh::{ServiceRecord, SignedRecord};
use agentmesh_proto::record::{
    MAX_RECORD_BYTES, MAX_SERVICES_PER_RECORD, RECORD_DOMAIN_PREFIX, RecordError, verify_record,
};
use prost::Message;

use crate::Report;
use crate::input::{Reader, Writer};
use crate::keys;

/// Who signs the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signer {
    /// `keys::peers()[0]`.
    First,
    /// `keys::peers()[1]`.
    Second,
    /// `keys::peers()[0]`, then one bit of the signature flipped.
    Flipped,
    /// Nobody: the signature is empty.
    Unsigned,
}

/// One record case, as the input encodes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// The body is a whole encoded `SignedRecord`.
    pub raw: bool,
    /// Who signs (ignored when `raw`).
    pub signer: Signer,
    /// `now` counts from the record's expiry.
    pub relative: bool,
    /// The verifier's clock (or its offset from the expiry).
    pub now: i64,
    /// Record bytes or an encoded signed record.
    pub body: Vec<u8>,
}

impl Case {
    /// A case for `record` signed by `signer`, checked at `now`.
    pub fn signed(record: &ServiceRecord, signer: Signer, now: i64) -> Self {
        Self {
            raw: false,
            signer,
            relative: false,
            now,
            body: record.encode_to_vec(),
        }
    }

    /// The input bytes.
    pub fn encode(&self) -> Vec<u8> {
        let signer = match self.signer {
            Signer::First => 0,
            Signer::Second => 1,
            Signer::Flipped => 2,
            Signer::Unsigned => 3,
        };
        let flags = u8::from(self.raw) | signer << 1 | u8::from(self.relative) << 3;
        Writer::new()
            .u8(flags)
            .i64(self.now)
            .bytes(&self.body)
            .finish()
    }

    /// Reads a case from any input.
    pub fn parse(data: &[u8]) -> Self {
        let mut r = Reader::new(data);
        let flags = r.u8();
        let now = r.i64();
        Self {
            raw: flags & 1 != 0,
            signer: match (flags >> 1) & 3 {
                0 => Signer::First,
                1 => Signer::Second,
                2 => Signer::Flipped,
                _ => Signer::Unsigned,
            },
            relative: flags & 8 != 0,
            now,
            body: r.rest().to_vec(),
        }
    }
}

fn sign(bytes: &[u8], key: &Keypair) -> Vec<u8> {
    let mut msg = RECORD_DOMAIN_PREFIX.to_vec();
    msg.extend_from_slice(bytes);
    key.sign(&msg).expect("ed25519 signing cannot fail")
}

/// Runs one input.
pub fn run(data: &[u8]) -> Report {
    let case = Case::parse(data);
    let mut report = Report::default();
    let signed = if case.raw {
        match SignedRecord::decode(case.body.as_slice()) {
            Ok(s) => s,
            Err(_) => {
                report.push("decode", "malformed");
                return report;
            }
        }
    } else {
        let peers = keys::peers();
        let mut signature = match case.signer {
            Signer::First | Signer::Flipped => sign(&case.body, &peers[0]),
            Signer::Second => sign(&case.body, &peers[1]),
            Signer::Unsigned => Vec::new(),
        };
        if case.signer == Signer::Flipped {
            signature[(case.now as u64 % 64) as usize] ^= 4;
        }
        SignedRecord {
            record: case.body.clone(),
            signature,
        }
    };
    let now = if case.relative {
        ServiceRecord::decode(signed.record.as_slice())
            .map_or(0, |r| r.expires_at_unix_secs)
            .saturating_add(case.now)
    } else {
        case.now
    };
    report.push("record", check(&signed, now));
    report
}

/// A short label for a record refusal.
pub fn label(e: &RecordError) -> &'static str {
    match e {
        RecordError::Malformed(_) => "malformed",
        RecordError::NoInlineKey => "no_inline_key",
        RecordError::BadSignature => "bad_signature",
        RecordError::Expired => "expired",
    }
}

/// Verifies `signed` at `now` and checks the answer against [`model`];
/// returns `"ok"` or the refusal's label.
pub fn check(signed: &SignedRecord, now: i64) -> &'static str {
    let got = verify_record(signed, now);
    let want = model(signed, now);
    match (&got, &want) {
        (Ok((rec, peer)), Ok((r, p))) => {
            assert_eq!((rec, peer), (r, p));
            assert_eq!(peer.to_bytes(), rec.provider, "a PeerId with two encodings");
            "ok"
        }
        (Err(e), Err(w)) => {
            assert_eq!(label(e), *w, "verify_record refused with {e}");
            w
        }
        _ => panic!("verify_record: {got:?}; the rules say {want:?}"),
    }
}

/// The rules a record must pass, in order: size and shape, a provider
/// whose PeerId embeds its key, that key's signature, then the expiry.
pub fn model(signed: &SignedRecord, now: i64) -> Result<(ServiceRecord, PeerId), &'static str> {
    if signed.record.len() > MAX_RECORD_BYTES {
        return Err("malformed");
    }
    let record = ServiceRecord::decode(signed.record.as_slice()).map_err(|_| "malformed")?;
    if record.services.len() > MAX_SERVICES_PER_RECORD {
        return Err("malformed");
    }
    let peer = PeerId::from_bytes(&record.provider).map_err(|_| "malformed")?;
    let mh = peer.as_ref();
    // Identity multihash (code 0): the digest is the protobuf public key.
    if mh.code() != 0 {
        return Err("no_inline_key");
    }
    let key = PublicKey::try_decode_protobuf(mh.digest()).map_err(|_| "no_inline_key")?;
    let mut msg = RECORD_DOMAIN_PREFIX.to_vec();
    msg.extend_from_slice(&signed.record);
    if !key.verify(&msg, &signed.signature) {
        return Err("bad_signature");
    }
    if record.expires_at_unix_secs < now {
        return Err("expired");
    }
    Ok((record, peer))
}
