//! `credential::verify` on claims the fuzzer writes and the harness signs
//! with a key the trust holds, against a model of the rules.
//!
//! Input: `flags: u8`, `now: i64`, `skew: u16`, `revoked_until: i32`
//! (relative to now), then the body: claim bytes to sign as they are, or
//! (flag `RAW`) a whole encoded `Credential`. The flags pick the signer
//! (current key, retired key, a stranger's key, or the current key with a
//! bit of the signature flipped), the peer the transport proved (none, the
//! subject, another peer), whether the subject is on the revocation list,
//! and whether `now` counts from the claims' issued-at.

use agentmesh_proto::credential::{
    CredentialError, DOMAIN_PREFIX, MAX_CREDENTIAL_BYTES, Trust, decode_credential, peek_claims,
    verify,
};
use agentmesh_proto::identity::PeerId;
use agentmesh_proto::pb::credential::{Claims, Credential, Revocation};
use prost::Message;

use crate::Report;
use crate::input::{Reader, Writer};
use crate::keys;

/// Who signs the claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signer {
    /// The current key ([`keys::CURRENT_KEY_ID`]).
    Current,
    /// The retired key ([`keys::RETIRED_KEY_ID`]).
    Retired,
    /// A key the trust does not hold.
    Stranger,
    /// The current key, then one bit of the signature flipped.
    Flipped,
}

/// Which peer the transport proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// None given (the caller checks the subject itself).
    Nobody,
    /// The credential's subject.
    Subject,
    /// Some other peer.
    Other,
}

/// One credential case, as the input encodes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// The body is a whole encoded `Credential` (not signed by the harness).
    pub raw: bool,
    /// Who signs (ignored when `raw`).
    pub signer: Signer,
    /// Which peer the transport proved.
    pub expect: Expect,
    /// The subject is revoked until `now + revoked_until`.
    pub revoke: bool,
    /// `now` counts from the claims' issued-at.
    pub relative: bool,
    /// The verifier's clock (or its offset from issued-at).
    pub now: i64,
    /// Allowed clock skew, seconds.
    pub skew: u16,
    /// End of the subject's revocation, relative to now.
    pub revoked_until: i32,
    /// Claim bytes or an encoded credential.
    pub body: Vec<u8>,
}

const RAW: u8 = 1;
const REVOKE: u8 = 1 << 5;
const RELATIVE: u8 = 1 << 6;

impl Case {
    /// A case for `claims` signed by `signer`, checked at `now` (absolute).
    pub fn signed(claims: &Claims, signer: Signer, expect: Expect, now: i64) -> Self {
        Self {
            raw: false,
            signer,
            expect,
            revoke: false,
            relative: false,
            now,
            skew: keys::SKEW_SECS as u16,
            revoked_until: 0,
            body: claims.encode_to_vec(),
        }
    }

    /// The input bytes.
    pub fn encode(&self) -> Vec<u8> {
        let signer = match self.signer {
            Signer::Current => 0,
            Signer::Retired => 1,
            Signer::Stranger => 2,
            Signer::Flipped => 3,
        };
        let expect = match self.expect {
            Expect::Nobody => 0,
            Expect::Subject => 1,
            Expect::Other => 2,
        };
        let flags = u8::from(self.raw)
            | signer << 1
            | expect << 3
            | if self.revoke { REVOKE } else { 0 }
            | if self.relative { RELATIVE } else { 0 };
        Writer::new()
            .u8(flags)
            .i64(self.now)
            .u16(self.skew)
            .i32(self.revoked_until)
            .bytes(&self.body)
            .finish()
    }

    /// Reads a case from any input.
    pub fn parse(data: &[u8]) -> Self {
        let mut r = Reader::new(data);
        let flags = r.u8();
        let (now, skew, revoked_until) = (r.i64(), r.u16(), r.i32());
        Self {
            raw: flags & RAW != 0,
            signer: match (flags >> 1) & 3 {
                0 => Signer::Current,
                1 => Signer::Retired,
                2 => Signer::Stranger,
                _ => Signer::Flipped,
            },
            expect: match (flags >> 3) & 3 {
                0 => Expect::Nobody,
                1 => Expect::Subject,
                // 3 reads as "another peer" too.
                _ => Expect::Other,
            },
            revoke: flags & REVOKE != 0,
            relative: flags & RELATIVE != 0,
            now,
            skew,
            revoked_until,
            body: r.rest().to_vec(),
        }
    }
}

/// Runs one input.
pub fn run(data: &[u8]) -> Report {
    let case = Case::parse(data);
    let mut report = Report::default();
    let cred = if case.raw {
        match decode_credential(&case.body) {
            Ok(c) => c,
            Err(e) => {
                report.push("decode", e.reason());
                return report;
            }
        }
    } else {
        let k = keys::signing();
        let mut cred = match case.signer {
            Signer::Current | Signer::Flipped => keys::sign_claim_bytes(&case.body, &k.current),
            Signer::Retired => keys::sign_claim_bytes(&case.body, &k.retired),
            Signer::Stranger => keys::sign_claim_bytes(&case.body, &k.stranger),
        };
        if case.signer == Signer::Flipped {
            let at = (case.skew as usize) % cred.signature.len();
            cred.signature[at] ^= 1 << (case.skew >> 13);
        }
        cred
    };
    let peeked = peek_claims(&cred).ok();
    let subject = peeked
        .as_ref()
        .and_then(|c| PeerId::from_bytes(&c.subject).ok());
    let issued = peeked.as_ref().map_or(0, |c| c.issued_at_unix_secs);
    let now = if case.relative {
        issued.saturating_add(case.now)
    } else {
        case.now
    };
    let other = keys::peer(1);
    let expected = match case.expect {
        Expect::Nobody => None,
        Expect::Subject => subject.as_ref(),
        Expect::Other => Some(&other),
    };
    // The trust every verifier holds, plus (maybe) the subject revoked.
    let mut trust = keys::trust().clone();
    let mut revocations = keys::revocations();
    let subject_until = now.saturating_add(i64::from(case.revoked_until));
    if case.revoke {
        revocations.push(Revocation {
            peer_id: peeked
                .as_ref()
                .map(|c| c.subject.clone())
                .unwrap_or_default(),
            until_unix_secs: subject_until,
            reason: String::new(),
            token_id: String::new(),
        });
    }
    trust.set_revocations(&revocations);
    let revoked_until = |p: &PeerId| {
        if case.revoke && subject.as_ref() == Some(p) {
            Some(subject_until)
        } else {
            keys::revoked_until(p)
        }
    };
    let outcome = check(
        &cred,
        &trust,
        now,
        expected,
        i64::from(case.skew),
        &revoked_until,
    );
    report.push("credential", outcome);
    report
}

/// Verifies `cred` and checks the answer against [`model`]; returns the
/// outcome's label (`"ok"` or a [`CredentialError::reason`]).
pub fn check(
    cred: &Credential,
    trust: &Trust,
    now: i64,
    expected: Option<&PeerId>,
    skew: i64,
    revoked_until: &dyn Fn(&PeerId) -> Option<i64>,
) -> &'static str {
    let got = verify(cred, trust, now, expected, skew);
    let want = model(cred, now, expected, skew, revoked_until);
    match (&got, &want) {
        (Ok(v), Ok((peer, claims))) => {
            assert_eq!(&v.peer, peer);
            assert_eq!(&v.claims, claims);
            assert_eq!(peek_claims(cred).as_ref(), Ok(claims));
            "ok"
        }
        (Err(e), Err(reason)) => {
            assert_eq!(e.reason(), *reason, "verify refused with {e}");
            assert!(CredentialError::REASONS.contains(reason));
            reason
        }
        _ => panic!("verify: {got:?}; the rules say {want:?}"),
    }
}

/// [`check`] with what every frame target's verifier holds: the test trust
/// at [`keys::NOW`] with [`keys::SKEW_SECS`], the transport having proved
/// `keys::peer(0)`.
pub fn check_member(cred: &Credential) -> &'static str {
    check(
        cred,
        keys::trust(),
        keys::NOW,
        Some(&keys::peer(0)),
        keys::SKEW_SECS,
        &keys::revoked_until,
    )
}

/// The rules a credential must pass, in the order the verifier applies
/// them (the order matters: nothing but size and shape is looked at before
/// the signature).
pub fn model(
    cred: &Credential,
    now: i64,
    expected: Option<&PeerId>,
    skew: i64,
    revoked_until: &dyn Fn(&PeerId) -> Option<i64>,
) -> Result<(PeerId, Claims), &'static str> {
    assert!(skew >= 0, "callers pass a skew of zero or more");
    if cred.claims.len() > MAX_CREDENTIAL_BYTES {
        return Err("malformed");
    }
    let claims = Claims::decode(cred.claims.as_slice()).map_err(|_| "malformed")?;
    let (key, verify_until) = keys::trusted_key(&claims.key_id).ok_or("unknown_key")?;
    let mut msg = DOMAIN_PREFIX.to_vec();
    msg.extend_from_slice(&cred.claims);
    if !key.verify(&msg, &cred.signature) {
        return Err("bad_signature");
    }
    if verify_until != 0 && now > verify_until {
        return Err("expired");
    }
    let peer = PeerId::from_bytes(&claims.subject).map_err(|_| "malformed")?;
    let (now_w, skew_w) = (i128::from(now), i128::from(skew));
    if now_w > i128::from(claims.expires_at_unix_secs) + skew_w {
        return Err("expired");
    }
    if now_w < i128::from(claims.issued_at_unix_secs) - skew_w {
        return Err("not_yet_valid");
    }
    if expected.is_some_and(|e| *e != peer) {
        return Err("wrong_peer");
    }
    if revoked_until(&peer).is_some_and(|until| until >= now) {
        return Err("revoked");
    }
    Ok((peer, claims))
}
