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
    /// `Watch`: its own, so a lease proof seen in flight cannot be replayed
    /// as a watch (or the other way) within the proof's ±5 min.
    Watch,
}

impl Purpose {
    fn domain(self) -> &'static [u8] {
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
    // `abs_diff` cannot overflow: `ts` is chosen by the prover, and `now - ts`
    // with `ts = i64::MIN` would panic (debug) or wrap past the check (release).
    if now.abs_diff(ts) > MAX_PROOF_AGE_SECS.unsigned_abs() {
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

    /// A proof whose timestamp is any `i64` is refused as stale, never a panic
    /// or a wrap-around that slips past the age check.
    #[test]
    fn extreme_timestamps_are_stale_not_a_panic() {
        let k = Keypair::generate_ed25519();
        for (ts, now) in [
            (i64::MIN, 1_700_000_000),
            (i64::MAX, 1_700_000_000),
            (i64::MIN, i64::MAX),
            (i64::MAX, i64::MIN),
            (i64::MIN, 0),
        ] {
            let p = make_proof(Purpose::Enroll, "http://cp", &k, ts);
            assert_eq!(
                verify_proof(Purpose::Enroll, "http://cp", &p, now),
                Err(ProofError::Stale { ts, now }),
                "ts {ts}, now {now}"
            );
        }
        // The boundary itself is still accepted, at both ends of the range.
        for (ts, now) in [(i64::MIN, i64::MIN + 300), (i64::MAX, i64::MAX - 300)] {
            let p = make_proof(Purpose::Enroll, "http://cp", &k, ts);
            assert!(verify_proof(Purpose::Enroll, "http://cp", &p, now).is_ok());
        }
    }

    proptest::proptest! {
        /// Any timestamp and clock: accepted exactly when within the age
        /// bound, and never a panic.
        #[test]
        fn staleness_matches_the_exact_distance(
            now in proptest::prelude::any::<i64>(),
            far in proptest::prelude::any::<i64>(),
            delta in -1000i64..1000,
            close in proptest::prelude::any::<bool>(),
        ) {
            // Half the cases near the boundary, half anywhere in the range.
            let ts = if close { now.saturating_add(delta) } else { far };
            let k = Keypair::generate_ed25519();
            let p = make_proof(Purpose::Refresh, "http://cp", &k, ts);
            let fresh = (i128::from(now) - i128::from(ts)).abs() <= i128::from(MAX_PROOF_AGE_SECS);
            let r = verify_proof(Purpose::Refresh, "http://cp", &p, now);
            proptest::prop_assert_eq!(r.is_ok(), fresh, "ts {} now {}: {:?}", ts, now, r);
        }
    }
}
