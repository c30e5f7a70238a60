//! What each fuzz target checks, as plain functions from bytes to a
//! [`Report`], so libFuzzer (`proto/fuzz`, nightly) and the corpus replay
//! test (stable, part of `cargo nextest run --workspace`) run the same code.
//!
//! Every target hands peer input to the real decoder or verifier and checks
//! the answer against what must hold; a panic is a finding. Targets whose
//! interesting paths sit behind a signature (credentials, proofs, records)
//! read a small header and sign the body with a fixed test key the verifier
//! trusts ([`keys`]), so expiry, subject, revocation and key-grace checks
//! are reached, not only "bad signature". Each such verifier is compared
//! with a plain model of its rules.
//!
//! The corpus lives in `proto/fuzz/corpus/<target>/`; [`seeds`] writes its
//! valid and invalid starting inputs.

pub mod frames;
pub mod input;
pub mod keys;
pub mod seeds;
pub mod targets;

/// Every fuzz target, by the name of its binary in `proto/fuzz` and of its
/// corpus directory.
pub const TARGETS: &[&str] = &[
    "credential",
    "enroll_proof",
    "auth_frames",
    "goaway_frames",
    "catalog_frames",
    "call_frames",
    "policy_frames",
    "record",
    "trust_keys",
    "revocation_list",
];

/// What one input reached: `(step, outcome)` pairs such as
/// `("credential", "revoked")`, for the seeds' checks that the harness gets
/// past the signature.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Steps in the order they ran.
    pub steps: Vec<(&'static str, &'static str)>,
}

impl Report {
    /// Records that `step` ended in `outcome`.
    pub fn push(&mut self, step: &'static str, outcome: &'static str) {
        self.steps.push((step, outcome));
    }

    /// Whether `step` ended in `outcome` at least once.
    pub fn has(&self, step: &str, outcome: &str) -> bool {
        self.steps.iter().any(|&(s, o)| s == step && o == outcome)
    }
}

/// Runs `data` through `target`; `None` for a name not in [`TARGETS`].
pub fn run(target: &str, data: &[u8]) -> Option<Report> {
    use targets::*;
    Some(match target {
        "credential" => credential::run(data),
        "enroll_proof" => enroll_proof::run(data),
        "auth_frames" => auth_frames::run(data),
        "goaway_frames" => goaway_frames::run(data),
        "catalog_frames" => catalog_frames::run(data),
        "call_frames" => call_frames::run(data),
        "policy_frames" => policy_frames::run(data),
        "record" => record::run(data),
        "trust_keys" => trust_keys::run(data),
        "revocation_list" => revocation_list::run(data),
        _ => return None,
    })
}
