//! Enrollment tokens: 256-bit random strings shown once; only their SHA-256
//! is stored (a fast hash is right for 256-bit random secrets).

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use rand::RngCore;
use sha2::{Digest, Sha256};

/// Prefix that makes a token recognisable in logs and secret scanners.
pub const TOKEN_PREFIX: &str = "amt_";
/// Longest token accepted on the wire, bytes.
pub const MAX_TOKEN_LEN: usize = 256;

/// A new token and its id.
pub fn generate() -> (String, String) {
    let mut secret = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut secret);
    let mut id = [0u8; 6];
    rand::thread_rng().fill_bytes(&mut id);
    (
        format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(secret)),
        format!("t-{}", hex::encode(id)),
    )
}

/// The stored digest of a token.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.trim().as_bytes()).into()
}

/// Constant-time equality of two secrets (compares their digests).
pub fn ct_eq(a: &str, b: &str) -> bool {
    let (a, b) = (digest(a), digest(b));
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_compared_in_constant_time() {
        let (a, ia) = generate();
        let (b, ib) = generate();
        assert_ne!(a, b);
        assert_ne!(ia, ib);
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() == TOKEN_PREFIX.len() + 43);
        assert!(ct_eq(&a, &a));
        assert!(!ct_eq(&a, &b));
        assert_eq!(digest(&a), digest(&format!(" {a}\n")));
    }
}
