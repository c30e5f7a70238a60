//! Proof of possession: a member signs (purpose, endpoint, PeerId, time) with
//! its libp2p key so a token or credential alone is not enough to act for it.

use libp2p_identity::{Keypair, PeerId, PublicKey};

use crate::pb::controlplane::ProofOfPossession;

/// What a proof is for; each signs under its own domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// `Enroll`.
    Enroll,
    /// `Refresh`.
    Refresh,
    /// `RouterLease`.
    Lease,
}

impl Purpose {
    fn domain(self) -> &'static [u8] {
        match self {
            Self::Enroll => b"agentmesh enroll v1\0",
            Self::Refresh => b"agentmesh refresh v1\0",
            Self::Lease => b"agentmesh lease v1\0",
        }
    }
}

/// How far a proof's timestamp may be from the verifier's clock (±5 min).
pub const MAX_PROOF_AGE_SECS: i64 = 300;

/// The bytes a proof signs.
pub fn proof_message(purpose: Purpose, public_url: &str, peer: &PeerId, ts: i64) -> Vec<u8> {
    let url = normalize_url(public_url);
    let peer = peer.to_bytes();
    let mut m = Vec::with_capacity(64 + url.len() + peer.len());
    m.extend_from_slice(purpose.domain());
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

/// Makes a proof with `key` at `now`.
pub fn make_proof(
    purpose: Purpose,
    public_url: &str,
    key: &Keypair,
    now: i64,
) -> ProofOfPossession {
    let peer = key.public().to_peer_id();
    let msg = proof_message(purpose, public_url, &peer, now);
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
    /// The signature does not verify.
    #[error("proof signature does not verify")]
    BadSignature,
}

/// Checks a proof and returns the prover's public key and PeerId.
pub fn verify_proof(
    purpose: Purpose,
    public_url: &str,
    proof: &ProofOfPossession,
    now: i64,
) -> Result<(PublicKey, PeerId), ProofError> {
    let key = PublicKey::try_decode_protobuf(&proof.public_key).map_err(|_| ProofError::BadKey)?;
    let ts = proof.timestamp_unix_secs;
    if (now - ts).abs() > MAX_PROOF_AGE_SECS {
        return Err(ProofError::Stale { ts, now });
    }
    let peer = key.to_peer_id();
    let msg = proof_message(purpose, public_url, &peer, ts);
    if !key.verify(&msg, &proof.signature) {
        return Err(ProofError::BadSignature);
    }
    Ok((key, peer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proof_round_trip_and_refusals() {
        let k = Keypair::generate_ed25519();
        let p = make_proof(Purpose::Enroll, "http://127.0.0.1:7400/", &k, 1000);
        let (_, peer) =
            verify_proof(Purpose::Enroll, "http://127.0.0.1:7400", &p, 1100).expect("valid");
        assert_eq!(peer, k.public().to_peer_id());
        // Other endpoint, other purpose, too old.
        assert_eq!(
            verify_proof(Purpose::Enroll, "http://evil:7400", &p, 1000),
            Err(ProofError::BadSignature)
        );
        assert_eq!(
            verify_proof(Purpose::Refresh, "http://127.0.0.1:7400", &p, 1000),
            Err(ProofError::BadSignature)
        );
        assert!(matches!(
            verify_proof(Purpose::Enroll, "http://127.0.0.1:7400", &p, 1000 + 301),
            Err(ProofError::Stale { .. })
        ));
    }
}
