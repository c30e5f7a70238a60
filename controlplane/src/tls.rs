//! The process-wide rustls crypto provider for gRPC TLS.
//!
//! rustls picks its provider from its cargo features only when exactly one
//! of `ring` and `aws-lc-rs` is on. In this workspace libp2p's QUIC (quinn)
//! turns on `aws-lc-rs` and tonic's `tls-ring` turns on `ring`, so any binary
//! or test that links both would panic when it first builds a TLS config.
//! Installing ring explicitly before that makes the choice independent of
//! which crates happen to be linked together.

/// Installs ring as the process's default rustls provider unless one is set.
pub fn ensure_crypto_provider() {
    // `Err` means a provider is already installed: that one stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    #[test]
    fn installing_twice_is_harmless() {
        super::ensure_crypto_provider();
        super::ensure_crypto_provider();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    }
}
