//! Go-away (`/agentmesh/goaway/1`): the router tells members to move.
//!
//! - this module: the reasons, the alternatives a go-away names, the message
//!   itself and [`GoAways`], what trimming, draining and the auth server use
//!   to build, send and count go-aways;
//! - `sender`: opening one stream per member (GoAway out, GoAwayAck in) with
//!   a per-stream timeout and a bounded fan-out, counted by result;
//! - `pace`: sending go-aways in waves the surviving routers can admit
//!   (what the drain and the trim use).

pub(crate) mod pace;
pub(crate) mod sender;

use std::sync::Arc;

use agentmesh_proto::pb::mesh::{Alternative, GoAway, GoAwayReason};
use libp2p::PeerId;

use crate::config::DrainConfig;
use crate::directory::{Directory, DirectoryRouter};
use crate::metrics::Metrics;

/// Alternatives named in one go-away at most.
pub(crate) const MAX_ALTERNATIVES: usize = 8;

/// Why the router sends a member away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Reason {
    /// The router is shutting down.
    Draining,
    /// The router is above its high watermark.
    Overloaded,
}

/// Every reason, to pre-create metric labels.
pub(crate) const REASONS: [Reason; 2] = [Reason::Draining, Reason::Overloaded];

/// Every result of sending one go-away (the `result` label):
/// `acked` (the member answered GoAwayAck), `timeout` (no ack within the
/// stream timeout), `unsupported` (the member does not speak the protocol),
/// `error` (the stream failed), `on_auth` (sent in place of an admission).
pub(crate) const RESULTS: [&str; 5] = ["acked", "timeout", "unsupported", "error", "on_auth"];

impl Reason {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Draining => "draining",
            Self::Overloaded => "overloaded",
        }
    }

    fn wire(self) -> GoAwayReason {
        match self {
            Self::Draining => GoAwayReason::Draining,
            Self::Overloaded => GoAwayReason::Overloaded,
        }
    }
}

/// Pre-creates every (reason, result) series of `agentmesh_router_goaway_sent_total`.
pub(crate) fn precreate_labels(metrics: &Metrics) {
    for reason in REASONS {
        for res in RESULTS {
            let _ = metrics
                .goaway
                .sent
                .get_or_create(&[("reason", reason.as_str()), ("result", res)]);
        }
    }
}

/// Whether router `r` of the directory may take members sent away from
/// this router (`me`): not draining, not this router, with addresses, and
/// below its low watermark (a router that reported no load yet is taken as
/// empty).
pub(crate) fn is_alternative(r: &DirectoryRouter, me: PeerId) -> bool {
    !r.draining
        && r.peer != me
        && !r.addrs.is_empty()
        && r.load
            .as_ref()
            .is_none_or(|l| l.low_watermark == 0 || l.attached_members < l.low_watermark)
}

/// Routers to suggest instead of this one (`me`): from the last directory,
/// those [`is_alternative`] accepts; least loaded first, at most
/// [`MAX_ALTERNATIVES`].
pub(crate) fn alternatives(directory: &Directory, me: PeerId) -> Vec<Alternative> {
    let dir = directory.routers.read();
    let mut alts: Vec<(f64, Alternative)> = dir
        .iter()
        .filter(|r| is_alternative(r, me))
        .map(|r| {
            let ratio = r.load.as_ref().map_or(0.0, |l| {
                f64::from(l.attached_members) / f64::from(l.high_watermark.max(1))
            });
            (
                ratio,
                Alternative {
                    peer_id: r.peer.to_bytes(),
                    addrs: r.addrs.iter().map(|a| a.to_string()).collect(),
                    load: r.load,
                },
            )
        })
        .collect();
    tracing::debug!(
        directory = dir.len(),
        candidates = alts.len(),
        "go-away alternatives"
    );
    alts.sort_by(|a, b| a.0.total_cmp(&b.0));
    alts.into_iter()
        .take(MAX_ALTERNATIVES)
        .map(|(_, a)| a)
        .collect()
}

/// What building, sending and counting go-aways needs.
#[derive(Clone)]
pub(crate) struct GoAways {
    /// Their pace, fan-out and stay-away.
    pub(crate) config: DrainConfig,
    /// The deadline of each exchange's reads and writes.
    pub(crate) stream_timeout: std::time::Duration,
    /// This router.
    pub(crate) me: PeerId,
    pub(crate) directory: Arc<Directory>,
    pub(crate) metrics: Metrics,
}

impl GoAways {
    /// The go-away message for `reason`.
    pub(crate) fn message(&self, reason: Reason) -> GoAway {
        GoAway {
            reason: reason.wire() as i32,
            retry_after_secs: u32::try_from(self.config.goaway_retry_after.as_secs())
                .unwrap_or(u32::MAX),
            alternatives: alternatives(&self.directory, self.me),
        }
    }

    /// Counts one go-away by reason and result.
    pub(crate) fn count(&self, reason: Reason, result: &'static str) {
        self.metrics
            .goaway
            .sent
            .get_or_create(&[("reason", reason.as_str()), ("result", result)])
            .inc();
    }
}
