//! What direct connections count: upgrade attempts by result, inbound
//! direct connections refused by reason (in their handshake or once it
//! is done), handshakes in progress on the listening port, calls by path,
//! dials whose port could not be reused.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{ReasonLabel, ResultLabel};
use prometheus_client::encoding::EncodeLabelSet;

/// Results of an upgrade (hole punch or connection reversal) of a
/// relayed connection: `direct` (a punch's direct connection came up),
/// `failed` (dcutr gave up or its exchange failed),
/// `skipped_endpoint_dependent` (our NAT maps each destination to its own
/// port, so we do not punch, and a reversal to that peer is already under
/// way), `skipped_backoff` (the last punch or reversal to that peer failed
/// and its backoff has not run out), `skipped_no_address` (no router has
/// told us our observed address yet, or the one observed is loopback and
/// peers may not dial it: every member on one host), `bad_target` (the peer asked a
/// punch or reversal to dial addresses we never dial); reversal, on the
/// side behind an endpoint-dependent NAT: `reversed` (our dial to the
/// peer's address came up), `reversal_failed` (that dial or the exchange
/// failed), `reversal_refused` (the peer would not take our dial); on the
/// side asked: `reversal_agreed`, `reversal_declined` (our NAT is
/// endpoint-dependent too, or no address of ours is known);
/// `repunched` (a punch or reversal to a peer we punched before our
/// observed address last changed, past its backoff if it had one);
/// `skipped_direct` (our punch's dial failed but the peer's dial brought
/// a direct connection up during that punch: dcutr's next attempt is not
/// made, one connection per punch), `skipped_in_progress` (a punch with that peer began
/// on another relayed connection and has no result yet, within the last
/// 10 s), `skipped_full` (`--direct-max-connections` direct connections
/// are open: the relayed path stays), `abandoned` (the relayed connection
/// the punch ran on closed before dcutr reported a result, which it then
/// never does, and no direct connection to the peer came up meanwhile),
/// `no_exchange` (the punch ended before dcutr dialed: the peer declined
/// its exchange, say while it backs off from us, or the relayed
/// connection failed under it; not backed off: nothing was learnt of the
/// path).
pub const UPGRADE_RESULTS: &[&str] = &[
    "direct",
    "failed",
    "skipped_endpoint_dependent",
    "skipped_backoff",
    "skipped_no_address",
    "bad_target",
    "reversed",
    "reversal_failed",
    "reversal_refused",
    "reversal_agreed",
    "reversal_declined",
    "repunched",
    "skipped_direct",
    "skipped_in_progress",
    "skipped_full",
    "abandoned",
    "no_exchange",
];

/// Why an inbound direct connection was closed at once:
/// `no_relayed_connection` (the peer holds no relayed connection to us
/// through a router), `direct_off` (`--direct=false`: nothing is accepted
/// on the listening port), `not_punching` (the peer holds a relayed
/// connection to us but no punch with it is under way: dcutr's exchange
/// with it did not end in the last 10 s); and in its handshake, by the
/// listening port's handshake table (`transport/handshakes.rs`): closed to
/// make room for a newcomer, the least progressed of its source,
/// `handshake_shed_source_full` (its source, an IPv4 address or an IPv6
/// /64, held `--direct-max-pending-inbound-per-source` and the newcomer
/// came from it), `handshake_shed_budget_full` (all
/// `--direct-max-pending-inbound` were taken and the newcomer's source,
/// its own, held its fair share), `handshake_shed_lighter_source` (all
/// were taken and the newcomer's source held fewer: the heaviest source
/// gave one); or refused at accept, `pending_full` (all were taken, every
/// source held its fair share and the newcomer's none); and once
/// established, `direct_full` (`--direct-max-connections` direct
/// connections are open).
pub const INBOUND_REFUSED_REASONS: &[&str] = &[
    "no_relayed_connection",
    "direct_off",
    "not_punching",
    "handshake_shed_source_full",
    "handshake_shed_budget_full",
    "handshake_shed_lighter_source",
    "pending_full",
    "direct_full",
];

/// Why a direct connection to a member closed: `timed_out` (bytes stayed
/// unacknowledged past `--direct-tcp-user-timeout-secs`, or the kernel gave
/// up retransmitting: the path died), `error` (another connection error),
/// `idle` (no stream for `--idle-connection-secs`: libp2p's keep-alive
/// timeout), `closed` (no error: closed by either side), and closed by us
/// for what the peer is: `unauthenticated` (no credential that verifies
/// within `--direct-auth-timeout-ms`, or a bad one), `revoked` (its
/// credential's node or token is revoked, at the hello or by a later
/// revocation list), `policy` (the access policy in force grants neither
/// of us a service of the other).
pub const DIRECT_CLOSE_REASONS: &[&str] = &[
    "timed_out",
    "error",
    "closed",
    "idle",
    "unauthenticated",
    "revoked",
    "policy",
];

/// Our NAT kind as the routers' observations classify it (`status` shows
/// the same): `unknown`, `one_observation`, `endpoint_independent`,
/// `endpoint_dependent`.
pub const NAT_KINDS: &[&str] = &[
    "unknown",
    "one_observation",
    "endpoint_independent",
    "endpoint_dependent",
];

/// `{nat}`: one of [`NAT_KINDS`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NatLabel {
    /// Our NAT kind.
    pub nat: &'static str,
}

/// The paths a call's stream can take.
pub const CALL_PATHS: &[&str] = &["direct", "relayed"];

/// The [`CALL_PATHS`] value of a stream that went `direct` or not.
pub(crate) fn path_name(direct: bool) -> &'static str {
    if direct { "direct" } else { "relayed" }
}

/// `{path, direction}`: one of [`CALL_PATHS`], `sent` or `received`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathDirectionLabel {
    /// `direct` or `relayed`.
    pub path: &'static str,
    /// `sent` or `received` (as seen by this node).
    pub direction: &'static str,
}

/// `{path}`: one of [`CALL_PATHS`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PathLabel {
    /// `direct` or `relayed`.
    pub path: &'static str,
}

/// What direct connections count.
#[derive(Clone, Debug)]
pub struct DirectMetrics {
    /// Upgrades of relayed connections by result ([`UPGRADE_RESULTS`]).
    pub upgrade_attempts: Family<ResultLabel, Counter>,
    /// Inbound direct connections closed at once, by reason
    /// ([`INBOUND_REFUSED_REASONS`]).
    pub inbound_refused: Family<ReasonLabel, Counter>,
    /// Outbound calls by the path their stream took ([`CALL_PATHS`]).
    pub call_paths: Family<PathLabel, Counter>,
    /// Dials that asked to leave from the listening port but could not
    /// (the tuple still in TIME_WAIT, or the port taken) and left from a
    /// fresh port instead.
    pub port_reuse_fallbacks: Counter,
    /// Dials from the listening port whose destination had just connected
    /// to that port (a punch landing on the listener first): the dial took
    /// that connection over.
    pub port_reuse_adopted: Counter,
    /// Calls whose stream failed on a direct connection: it was closed
    /// and the call retried relayed within its budget.
    pub direct_fallbacks: Counter,
    /// Direct connections closed, by reason ([`DIRECT_CLOSE_REASONS`]).
    pub direct_closed: Family<ReasonLabel, Counter>,
    /// Call payload bytes by path and direction, inbound and outbound
    /// calls alike.
    pub call_bytes_by_path: Family<PathDirectionLabel, Counter>,
    /// Open direct connections to members, under our NAT kind
    /// ([`NAT_KINDS`]; the others read zero).
    pub direct_connections: Family<NatLabel, Gauge>,
    /// Inbound connections in their handshake on the listening port now
    /// (at most `--direct-max-pending-inbound`).
    pub direct_handshakes_in_progress: Gauge,
    /// Time from a punch's start (its relayed connection up) to its
    /// success, seconds: a call made sooner after the first goes relayed.
    pub punch_duration: Histogram,
}

/// [`DirectMetrics::punch_duration`]'s buckets, seconds.
const PUNCH_DURATION_BUCKETS: [f64; 9] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0];

impl Default for DirectMetrics {
    fn default() -> Self {
        Self {
            upgrade_attempts: Family::default(),
            inbound_refused: Family::default(),
            call_paths: Family::default(),
            port_reuse_fallbacks: Counter::default(),
            port_reuse_adopted: Counter::default(),
            direct_fallbacks: Counter::default(),
            direct_closed: Family::default(),
            call_bytes_by_path: Family::default(),
            direct_connections: Family::default(),
            direct_handshakes_in_progress: Gauge::default(),
            punch_duration: Histogram::new(PUNCH_DURATION_BUCKETS),
        }
    }
}

/// The direct-connection counters of one node, read in-process
/// ([`crate::NodeHandle::direct_counts`]): what an embedder running many
/// members in one process (the ladder) sums across them, without a
/// registry per member.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DirectCounts {
    /// `upgrade_attempts_total` by result, every one of [`UPGRADE_RESULTS`].
    pub upgrades: Vec<(&'static str, u64)>,
    /// `inbound_refused_total` by reason, every one of
    /// [`INBOUND_REFUSED_REASONS`].
    pub inbound_refused: Vec<(&'static str, u64)>,
    /// `direct_closed_total` by reason, every one of [`DIRECT_CLOSE_REASONS`].
    pub closed: Vec<(&'static str, u64)>,
    /// `direct_fallbacks_total`: calls whose stream failed on a direct
    /// connection and were retried relayed.
    pub fallbacks: u64,
    /// `port_reuse_fallbacks_total`: dials that could not leave from the
    /// listening port.
    pub port_reuse_fallbacks: u64,
    /// `punch_duration_seconds` as cumulative buckets: upper bound in
    /// seconds, punches that took at most that long (the last, +Inf,
    /// counts every punch timed).
    pub punch_durations: Vec<(f64, u64)>,
    /// Direct connections open now (`direct_connections`, all NAT kinds).
    pub open: u64,
}

impl DirectMetrics {
    /// Pre-creates every label value.
    pub(super) fn precreate(&self) {
        for result in UPGRADE_RESULTS {
            let _ = self.upgrade_attempts.get_or_create(&ResultLabel { result });
        }
        for reason in INBOUND_REFUSED_REASONS {
            let _ = self.inbound_refused.get_or_create(&ReasonLabel { reason });
        }
        for path in CALL_PATHS {
            let _ = self.call_paths.get_or_create(&PathLabel { path });
        }
        for reason in DIRECT_CLOSE_REASONS {
            let _ = self.direct_closed.get_or_create(&ReasonLabel { reason });
        }
        for nat in NAT_KINDS {
            let _ = self.direct_connections.get_or_create(&NatLabel { nat });
        }
        for path in CALL_PATHS {
            for direction in ["sent", "received"] {
                let _ = self
                    .call_bytes_by_path
                    .get_or_create(&PathDirectionLabel { path, direction });
            }
        }
    }

    /// What the counters read now.
    pub fn counts(&self) -> DirectCounts {
        DirectCounts {
            upgrades: UPGRADE_RESULTS
                .iter()
                .map(|&result| {
                    let n = self
                        .upgrade_attempts
                        .get_or_create(&ResultLabel { result })
                        .get();
                    (result, n)
                })
                .collect(),
            inbound_refused: INBOUND_REFUSED_REASONS
                .iter()
                .map(|&reason| {
                    let n = self
                        .inbound_refused
                        .get_or_create(&ReasonLabel { reason })
                        .get();
                    (reason, n)
                })
                .collect(),
            closed: DIRECT_CLOSE_REASONS
                .iter()
                .map(|&reason| {
                    let n = self
                        .direct_closed
                        .get_or_create(&ReasonLabel { reason })
                        .get();
                    (reason, n)
                })
                .collect(),
            fallbacks: self.direct_fallbacks.get(),
            punch_durations: cumulative_buckets(&self.punch_duration),
            port_reuse_fallbacks: self.port_reuse_fallbacks.get(),
            open: NAT_KINDS
                .iter()
                .map(|&nat| {
                    let n = self
                        .direct_connections
                        .get_or_create(&NatLabel { nat })
                        .get();
                    u64::try_from(n).unwrap_or(0)
                })
                .sum(),
        }
    }

    /// Registers each metric in `r` (already prefixed).
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "upgrade_attempts",
            "Upgrades of relayed connections to direct ones (DCUtR hole punches and connection reversals), by result (direct, failed, skipped_endpoint_dependent, skipped_backoff, skipped_no_address, bad_target; reversal: reversed, reversal_failed, reversal_refused, reversal_agreed, reversal_declined; repunched: punched again after our observed address changed; skipped_direct, skipped_in_progress, skipped_full; abandoned: the relayed connection the punch ran on closed before its result, with no direct connection to the peer since it began; no_exchange: the punch ended before any dial, the peer having declined the exchange or the relayed connection failed, not backed off)",
            self.upgrade_attempts.clone(),
        );
        r.register(
            "inbound_refused",
            "Inbound direct connections closed at once, by reason (no_relayed_connection: the peer holds no relayed connection to us; direct_off; not_punching: the peer holds a relayed connection but no punch with it is under way; closed in their handshake, the least progressed of their source, to make room for a newcomer: handshake_shed_source_full: its source held --direct-max-pending-inbound-per-source, handshake_shed_budget_full: --direct-max-pending-inbound were taken and the newcomer's source held its share, handshake_shed_lighter_source: they were taken and a source holding fewer came; pending_full: refused at accept, they were taken and every source held its share)",
            self.inbound_refused.clone(),
        );
        r.register(
            "calls_by_path",
            "Outbound calls by the path their stream took (direct or relayed through a router)",
            self.call_paths.clone(),
        );
        r.register(
            "port_reuse_fallbacks",
            "Dials that could not leave from the listening port (tuple in TIME_WAIT, port taken) and used a fresh port",
            self.port_reuse_fallbacks.clone(),
        );
        r.register(
            "port_reuse_adopted",
            "Dials from the listening port whose destination had just connected to that port (a punch landing on the listener first): the dial took that connection over as its own",
            self.port_reuse_adopted.clone(),
        );
        r.register(
            "direct_fallbacks",
            "Calls whose stream failed on a direct connection: that connection was closed, punches to the peer backed off, and the call retried on a relayed connection within its budget",
            self.direct_fallbacks.clone(),
        );
        r.register(
            "call_bytes_by_path",
            "Call payload bytes by the path the call's stream took (direct or relayed) and direction (sent or received, as seen by this node), inbound and outbound calls alike",
            self.call_bytes_by_path.clone(),
        );
        r.register(
            "direct_connections",
            "Open direct connections to other members, labelled by our NAT kind as the routers' observations classify it (unknown, one_observation, endpoint_independent, endpoint_dependent; the kinds we are not read zero)",
            self.direct_connections.clone(),
        );
        r.register(
            "direct_handshakes_in_progress",
            "Inbound connections in their handshake on the direct-connection listening port now (at most --direct-max-pending-inbound)",
            self.direct_handshakes_in_progress.clone(),
        );
        r.register(
            "direct_closed",
            "Direct connections closed, by reason (timed_out: bytes stayed unacknowledged past --direct-tcp-user-timeout-secs or the kernel gave up, the path died; error: another connection error; closed: no error, closed by either side; idle: no stream for --idle-connection-secs; unauthenticated: no verified credential within --direct-auth-timeout-ms, or a bad one; revoked: the peer's node or token is revoked; policy: the access policy grants neither side a service of the other)",
            self.direct_closed.clone(),
        );
        r.register_with_unit(
            "punch_duration",
            "Time from a hole punch's start (its relayed connection up) to its success: calls made sooner after the first go relayed",
            prometheus_client::registry::Unit::Seconds,
            self.punch_duration.clone(),
        );
    }

    /// Counts one upgrade result (one of [`UPGRADE_RESULTS`]).
    pub(crate) fn upgrade(&self, result: &'static str) {
        self.upgrade_attempts
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Counts one inbound direct connection refused.
    pub(crate) fn refused(&self, reason: &'static str) {
        self.inbound_refused
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Counts one direct connection closed (one of [`DIRECT_CLOSE_REASONS`]).
    pub(crate) fn direct_closed(&self, reason: &'static str) {
        self.direct_closed
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// The byte counters (sent, received) of a call whose stream went
    /// `direct` or relayed.
    pub(crate) fn path_bytes(&self, direct: bool) -> (Counter, Counter) {
        let path = path_name(direct);
        let get = |direction| {
            self.call_bytes_by_path
                .get_or_create(&PathDirectionLabel { path, direction })
                .clone()
        };
        (get("sent"), get("received"))
    }

    /// Sets the open direct connections (`n`) under `nat`, the other NAT
    /// kinds to zero.
    pub(crate) fn set_direct_connections(&self, nat: &'static str, n: usize) {
        for kind in NAT_KINDS {
            let v = if *kind == nat { n as i64 } else { 0 };
            self.direct_connections
                .get_or_create(&NatLabel { nat: kind })
                .set(v);
        }
    }

    /// Counts one outbound call's path.
    pub(crate) fn call_path(&self, direct: bool) {
        self.call_paths
            .get_or_create(&PathLabel {
                path: path_name(direct),
            })
            .inc();
    }
}

/// A histogram's cumulative buckets (upper bound, count), read through
/// its text encoding: prometheus-client keeps them private.
fn cumulative_buckets(h: &Histogram) -> Vec<(f64, u64)> {
    let mut r = Registry::default();
    r.register("h", "", h.clone());
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &r).is_err() {
        return Vec::new();
    }
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("h_bucket{le=\"")?;
            let (le, value) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, value.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_every_label_value_and_the_open_connections_of_all_nat_kinds() {
        let m = DirectMetrics::default();
        m.precreate();
        m.upgrade_attempts
            .get_or_create(&ResultLabel { result: "direct" })
            .inc_by(3);
        m.inbound_refused
            .get_or_create(&ReasonLabel {
                reason: "handshake_shed_source_full",
            })
            .inc();
        m.direct_connections
            .get_or_create(&NatLabel {
                nat: "endpoint_independent",
            })
            .set(2);
        m.direct_connections
            .get_or_create(&NatLabel { nat: "unknown" })
            .set(1);
        let c = m.counts();
        assert_eq!(c.upgrades.len(), UPGRADE_RESULTS.len());
        assert_eq!(c.inbound_refused.len(), INBOUND_REFUSED_REASONS.len());
        let of = |v: &[(&str, u64)], k: &str| v.iter().find(|(n, _)| *n == k).map(|(_, n)| *n);
        assert_eq!(of(&c.upgrades, "direct"), Some(3));
        assert_eq!(of(&c.upgrades, "failed"), Some(0));
        assert_eq!(
            of(&c.inbound_refused, "handshake_shed_source_full"),
            Some(1)
        );
        assert_eq!(c.open, 3);
        assert_eq!(c.closed.len(), DIRECT_CLOSE_REASONS.len());
        assert_eq!((c.fallbacks, c.port_reuse_fallbacks), (0, 0));
        m.punch_duration.observe(0.3);
        m.punch_duration.observe(2.5);
        let b = m.counts().punch_durations;
        assert_eq!(b.len(), PUNCH_DURATION_BUCKETS.len() + 1, "{b:?}");
        assert_eq!(b[0], (0.05, 0));
        assert_eq!(b[3], (0.5, 1));
        assert_eq!(b[6], (3.0, 2));
        assert_eq!(b[b.len() - 1], (f64::INFINITY, 2));
    }
}
