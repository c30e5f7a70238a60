//! What telling routers about circuits upgraded away counts
//! (`crate::engine::upgrade_notice`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::ResultLabel;

/// Results of one notice to a router that a circuit through it was
/// replaced by a direct connection: `ok` (the router counted it),
/// `refused` (the router answered why not: no such circuit as it sees
/// them, counted already, or we are not admitted there), `timed_out` (no
/// answer within the call timeout), `failed` (the stream could not be
/// opened or broke).
pub const UPGRADE_NOTICE_RESULTS: &[&str] = &["ok", "refused", "timed_out", "failed"];

/// What upgrade notices count.
#[derive(Clone, Debug, Default)]
pub struct UpgradeNoticeMetrics {
    /// Notices sent, by result ([`UPGRADE_NOTICE_RESULTS`]).
    pub sent: Family<ResultLabel, Counter>,
}

impl UpgradeNoticeMetrics {
    /// Pre-creates every result.
    pub(super) fn precreate(&self) {
        for result in UPGRADE_NOTICE_RESULTS {
            let _ = self.sent.get_or_create(&ResultLabel { result });
        }
    }

    /// Registers them in `r` (already prefixed).
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "upgrade_notices",
            "Notices to a router that a circuit through it was replaced by a direct connection, by result (ok: counted by the router; refused: the router said why not; timed_out; failed: no stream or it broke)",
            self.sent.clone(),
        );
    }

    /// Counts one notice's result (one of [`UPGRADE_NOTICE_RESULTS`]).
    pub(crate) fn count(&self, result: &'static str) {
        self.sent.get_or_create(&ResultLabel { result }).inc();
    }
}
