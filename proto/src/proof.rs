//! Proof of possession bound to its request: a caller signs, with its
//! libp2p key, what the proof is for, the control plane's endpoint, its
//! PeerId, the time, and a digest of every other field of the request the
//! proof travels in. A token or credential alone is then not enough to act
//! for a key, and a proof seen in flight (valid for ±5 min) cannot be moved
//! onto another request: replayed, it can only repeat the request it was
//! made for.
//!
//! # What each proof signs (format v2)
//!
//! Every proof signs `domain ‖ url ‖ peer ‖ timestamp ‖ binding`
//! ([`proof_message`]): the purpose's domain (`"agentmesh <purpose> v2\0"`),
//! the endpoint without a trailing `/` and the PeerId's bytes (each with a
//! 4-byte big-endian length), the timestamp (8 bytes, big-endian), and a
//! 32-byte **binding**: SHA-256 over the request's fields other than the
//! proof, exactly as sent, in field order, each framed (byte strings and
//! counts with an 8-byte big-endian length, numbers fixed-width, optional
//! messages behind a presence byte), so no two requests share a binding:
//!
//! | request | bound fields | so a seen proof cannot |
//! |---|---|---|
//! | `EnrollRequest` | `token` (only its digest is signed, never the secret) | enroll its key through another token, i.e. take another role or labels |
//! | `RefreshRequest` | `credential` (claims bytes and signature) | refresh another credential of the key |
//! | `RouterLeaseRequest` | `credential`; `addrs` and `labels`, in order; `load` (present or not, its four counts); `draining` | publish other addresses, labels, load or draining flag for the router |
//! | `WatchRequest` | `credential` | open a watch on another credential |
//!
//! A new field in any of these messages fails to compile here until it is
//! bound (the bindings destructure each message whole).
//!
//! Compatibility: format v1 signed no binding and no longer verifies. A v1
//! proof that checks out under the v1 rules is refused as
//! [`ProofError::OldFormat`], so a program older than the control plane
//! hears why; a control plane older than its callers refuses their v2
//! proofs as bad signatures. Every program in a mesh is upgraded together.

use libp2p_identity::{Keypair, PeerId, PublicKey};
use sha2::{Digest, Sha256};

use crate::pb::{
    controlplane::{
        EnrollRequest, ProofOfPossession, RefreshRequest, RouterLeaseRequest, RouterLoad,
        WatchRequest,
    },
    credential::{Credential, Label},
};

/// What a proof is for; each signs under its own domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `Enroll`.
    Enroll,
    /// `Refresh`.
    Refresh,
    /// `RouterLease`.
    Lease,
    /// `Watch`: its own, so a lease proof seen in flight cannot be replayed
    /// as a watch (or the other way) within the proof's ±5 min.
    Watch,
}

impl Purpose {
    fn domain(self) -> &'static [u8] {
        match self {
            Self::Enroll => b"agentmesh enroll v2\0",
            Self::Refresh => b"agentmesh refresh v2\0",
            Self::Lease => b"agentmesh lease v2\0",
            Self::Watch => b"agentmesh watch v2\0",
        }
    }

    /// The unbound format's domain, only to recognise an old proof.
    fn domain_v1(self) -> &'static [u8] {
        match self {
            Self::Enroll => b"agentmesh enroll v1\0",
            Self::Refresh => b"agentmesh refresh v1\0",
            Self::Lease => b"agentmesh lease v1\0",
            Self::Watch => b"agentmesh watch v1\0",
        }
    }
}

/// How far a proof's timestamp may be from the verifier's clock (±5 min).
pub const MAX_PROOF_AGE_SECS: i64 = 300;

/// What a proof is bound to: its purpose and the digest of the other
/// fields of its request (see the module docs for which).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    purpose: Purpose,
    digest: [u8; 32],
}

impl Binding {
    /// What the proof is for.
    pub fn purpose(&self) -> Purpose {
        self.purpose
    }

    /// The SHA-256 of the request's bound fields.
    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }
}

/// A request that carries a proof bound to its other fields.
pub trait Bound: Sized {
    /// The binding of this request's fields (its proof aside).
    fn binding(&self) -> Binding;

    /// The proof it carries.
    fn proof(&self) -> Option<&ProofOfPossession>;

    /// Replaces the proof it carries.
    fn set_proof(&mut self, proof: ProofOfPossession);

    /// This request with a fresh proof by `key` at `now` bound to it.
    fn proven(mut self, public_url: &str, key: &Keypair, now: i64) -> Self {
        let p = make_proof(&self.binding(), public_url, key, now);
        self.set_proof(p);
        self
    }
}

impl Bound for EnrollRequest {
    fn binding(&self) -> Binding {
        let Self { token, proof: _ } = self;
        let mut f = Fields::default();
        f.bytes(token.as_bytes());
        f.finish(Purpose::Enroll)
    }
    fn proof(&self) -> Option<&ProofOfPossession> {
        self.proof.as_ref()
    }
    fn set_proof(&mut self, proof: ProofOfPossession) {
        self.proof = Some(proof);
    }
}

impl Bound for RefreshRequest {
    fn binding(&self) -> Binding {
        let Self {
            credential,
            proof: _,
        } = self;
        let mut f = Fields::default();
        f.credential(credential.as_ref());
        f.finish(Purpose::Refresh)
    }
    fn proof(&self) -> Option<&ProofOfPossession> {
        self.proof.as_ref()
    }
    fn set_proof(&mut self, proof: ProofOfPossession) {
        self.proof = Some(proof);
    }
}

impl Bound for RouterLeaseRequest {
    fn binding(&self) -> Binding {
        let Self {
            credential,
            proof: _,
            addrs,
            labels,
            load,
            draining,
        } = self;
        let mut f = Fields::default();
        f.credential(credential.as_ref());
        f.count(addrs.len());
        for a in addrs {
            f.bytes(a.as_bytes());
        }
        f.count(labels.len());
        for Label { key, value } in labels {
            f.bytes(key.as_bytes());
            f.bytes(value.as_bytes());
        }
        f.present(load.is_some());
        if let Some(RouterLoad {
            attached_members,
            transit_connections,
            high_watermark,
            low_watermark,
        }) = load
        {
            for n in [
                attached_members,
                transit_connections,
                high_watermark,
                low_watermark,
            ] {
                f.u32(*n);
            }
        }
        f.present(*draining);
        f.finish(Purpose::Lease)
    }
    fn proof(&self) -> Option<&ProofOfPossession> {
        self.proof.as_ref()
    }
    fn set_proof(&mut self, proof: ProofOfPossession) {
        self.proof = Some(proof);
    }
}

impl Bound for WatchRequest {
    fn binding(&self) -> Binding {
        let Self {
            credential,
            proof: _,
        } = self;
        let mut f = Fields::default();
        f.credential(credential.as_ref());
        f.finish(Purpose::Watch)
    }
    fn proof(&self) -> Option<&ProofOfPossession> {
        self.proof.as_ref()
    }
    fn set_proof(&mut self, proof: ProofOfPossession) {
        self.proof = Some(proof);
    }
}

/// The framed fields of one request, hashed as they are written.
#[derive(Default)]
struct Fields(Sha256);

impl Fields {
    fn count(&mut self, n: usize) {
        self.0.update((n as u64).to_be_bytes());
    }

    fn bytes(&mut self, b: &[u8]) {
        self.count(b.len());
        self.0.update(b);
    }

    fn u32(&mut self, n: u32) {
        self.0.update(n.to_be_bytes());
    }

    fn present(&mut self, yes: bool) {
        self.0.update([u8::from(yes)]);
    }

    fn credential(&mut self, c: Option<&Credential>) {
        self.present(c.is_some());
        if let Some(Credential { claims, signature }) = c {
            self.bytes(claims);
            self.bytes(signature);
        }
    }

    fn finish(self, purpose: Purpose) -> Binding {
        Binding {
            purpose,
            digest: self.0.finalize().into(),
        }
    }
}

/// The bytes a proof bound to `bound` signs.
pub fn proof_message(bound: &Binding, public_url: &str, peer: &PeerId, ts: i64) -> Vec<u8> {
    let mut m = head(bound.purpose.domain(), public_url, peer, ts);
    m.extend_from_slice(&bound.digest);
    m
}

/// Domain, endpoint, PeerId and time: what both formats sign first (v1
/// signed only this).
fn head(domain: &[u8], public_url: &str, peer: &PeerId, ts: i64) -> Vec<u8> {
    let url = normalize_url(public_url);
    let peer = peer.to_bytes();
    let mut m = Vec::with_capacity(96 + url.len() + peer.len());
    m.extend_from_slice(domain);
    m.extend_from_slice(&(url.len() as u32).to_be_bytes());
    m.extend_from_slice(url.as_bytes());
    m.extend_from_slice(&(peer.len() as u32).to_be_bytes());
    m.extend_from_slice(&peer);
    m.extend_from_slice(&ts.to_be_bytes());
    m
}

/// The endpoint string both sides sign: without a trailing slash.
pub fn normalize_url(url: &str) -> &str {
    url.trim_end_matches('/')
}

/// Makes a proof bound to `bound` with `key` at `now` (requests use
/// [`Bound::proven`]).
pub fn make_proof(bound: &Binding, public_url: &str, key: &Keypair, now: i64) -> ProofOfPossession {
    let peer = key.public().to_peer_id();
    let msg = proof_message(bound, public_url, &peer, now);
    ProofOfPossession {
        public_key: key.public().encode_protobuf(),
        timestamp_unix_secs: now,
        // Signing with ed25519 cannot fail.
        signature: key.sign(&msg).unwrap_or_default(),
    }
}

/// Why a proof was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProofError {
    /// The public key does not decode.
    #[error("public key does not decode")]
    BadKey,
    /// Timestamp more than ±5 min from now.
    #[error("proof timestamp {ts} is too far from now ({now})")]
    Stale {
        /// Timestamp in the proof.
        ts: i64,
        /// Verifier's clock.
        now: i64,
    },
    /// The signature does not verify for this request.
    #[error("proof signature does not verify for this request")]
    BadSignature,
    /// A proof in format v1, which binds no request: its maker predates
    /// this verifier.
    #[error(
        "proof is in the old v1 format, which binds no request; upgrade the caller \
         (every program in a mesh runs the same proof format, v2)"
    )]
    OldFormat,
}

/// Checks a proof for the request whose binding is `bound` and returns the
/// prover's public key and PeerId.
pub fn verify_proof(
    bound: &Binding,
    public_url: &str,
    proof: &ProofOfPossession,
    now: i64,
) -> Result<(PublicKey, PeerId), ProofError> {
    let key = PublicKey::try_decode_protobuf(&proof.public_key).map_err(|_| ProofError::BadKey)?;
    let ts = proof.timestamp_unix_secs;
    // `abs_diff` cannot overflow: `ts` is chosen by the prover, and `now - ts`
    // with `ts = i64::MIN` would panic (debug) or wrap past the check (release).
    if now.abs_diff(ts) > MAX_PROOF_AGE_SECS.unsigned_abs() {
        return Err(ProofError::Stale { ts, now });
    }
    let peer = key.to_peer_id();
    if key.verify(
        &proof_message(bound, public_url, &peer, ts),
        &proof.signature,
    ) {
        return Ok((key, peer));
    }
    // Only a refused proof pays for this second check.
    let v1 = head(bound.purpose.domain_v1(), public_url, &peer, ts);
    if key.verify(&v1, &proof.signature) {
        return Err(ProofError::OldFormat);
    }
    Err(ProofError::BadSignature)
}

#[cfg(test)]
mod tests;
