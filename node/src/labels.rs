//! The two label sets most of the member's metrics share, below every
//! module that counts with them (`metrics` and `policy` both do, and
//! `metrics` holds the policy's metrics).

use prometheus_client::encoding::EncodeLabelSet;

/// `{result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// The outcome.
    pub result: &'static str,
}

/// `{reason}`: one of the reasons the counting module pre-creates (e.g.
/// `metrics::REPLACE_REASONS`, `CALL_RETRY_REASONS`, `GOAWAY_RELEASE_REASONS`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The reason.
    pub reason: &'static str,
}
