//! What the engine counts holding routers: attachment, readiness, the credential, auth, reservations, records, the control plane, go-aways and shuns.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::*;

/// What the engine counts holding routers: attachment, readiness, the credential, auth, reservations, records, the control plane, go-aways and shuns.
#[derive(Clone, Debug, Default)]
pub struct RouterMetrics {
    /// Routers with an active reservation.
    pub routers_attached: Gauge,
    /// Routers wanted (K).
    pub routers_wanted: Gauge,
    /// Routers in the directory matching the selector.
    pub router_candidates: Gauge,
    /// 1 while ready.
    pub ready: Gauge,
    /// Expiry of the current credential, Unix seconds.
    pub credential_expires_at: Gauge,
    /// Auth exchanges with routers by result.
    pub auth: Family<ResultLabel, Counter>,
    /// Relay reservations by result (`ok`: accepted, `error`: refused or lost).
    pub reservations: Family<ResultLabel, Counter>,
    /// Record publications by result.
    pub publishes: Family<ResultLabel, Counter>,
    /// Control-plane operations by op and result.
    pub control_plane: Family<OpLabels, Counter>,
    /// Go-aways received by result ([`GOAWAY_RESULTS`]).
    pub goaways: Family<ResultLabel, Counter>,
    /// Routers that sent go-away let go, by reason ([`GOAWAY_RELEASE_REASONS`]).
    pub goaway_releases: Family<ReasonLabel, Counter>,
    /// Routers let go after their go-away but still connected because a
    /// relayed connection through them carries a call (`engine::linger`).
    pub goaway_lingering: Gauge,
    /// How each such linger ended, by reason ([`GOAWAY_LINGER_ENDS`]).
    pub goaway_linger_ends: Family<ReasonLabel, Counter>,
    /// Held routers given up for another one, by reason ([`REPLACE_REASONS`]).
    pub routers_replaced: Family<ReasonLabel, Counter>,
    /// Connections to a router retried after a backoff because the dial or
    /// the first auth's connection was refused or closed.
    pub auth_conn_retries: Counter,
    /// Routers that refused our credential as revoked; each is then passed
    /// over until the credential changes (at most `REVOKED_SHUN`).
    pub router_revoked_refusals: Counter,
    /// 1 while the signed revocation list the node holds names its own
    /// credential: it then asks no router until the credential changes.
    pub credential_revoked: Gauge,
    /// Directory fetches started, by schedule ([`DIRECTORY_SCHEDULES`]):
    /// `no_router` and `short_of_k` rising show members the cached
    /// directory could not help (e.g. after the whole mesh restarted).
    pub directory_fetches: Family<ScheduleLabel, Counter>,
    /// Shuns of routers that had left (go-away, DRAINING) ended because a
    /// directory fetched since showed them back, not draining, their lease
    /// renewed (`engine::shun`).
    pub shuns_lifted: Counter,
    /// Attaches to routers put off by a random wait, by reason
    /// ([`SPREAD_REASONS`]): `replace`, a lost router while another
    /// serves (`--router-replace-spread-ms`); `rejoin`, the other K − 1
    /// once a node that had lost every router holds one again
    /// (`--router-rejoin-spread-ms`).
    pub attaches_spread: Family<ReasonLabel, Counter>,
}

impl RouterMetrics {
    /// Registers each metric in `r` (already prefixed).
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "routers_attached",
            "Routers with an active relay reservation",
            self.routers_attached.clone(),
        );
        r.register(
            "routers_wanted",
            "Routers wanted (K)",
            self.routers_wanted.clone(),
        );
        r.register(
            "router_candidates",
            "Routers in the directory matching the selector",
            self.router_candidates.clone(),
        );
        r.register("ready", "1 while the node is ready", self.ready.clone());
        r.register(
            "credential_expires_at_seconds",
            "Expiry of the current credential (Unix seconds)",
            self.credential_expires_at.clone(),
        );
        r.register(
            "auth",
            "Auth exchanges with routers by result",
            self.auth.clone(),
        );
        r.register(
            "reservations",
            "Relay reservations by result",
            self.reservations.clone(),
        );
        r.register(
            "publishes",
            "Service record publications by result",
            self.publishes.clone(),
        );
        r.register(
            "control_plane",
            "Control-plane operations by op and result",
            self.control_plane.clone(),
        );
        r.register(
            "goaways",
            "Go-aways received by result (reason obeyed, ignored, overflow, error)",
            self.goaways.clone(),
        );
        r.register(
            "goaway_releases",
            "Routers that sent go-away let go, by reason (replaced: K others reserved; router_closed: it closed us first)",
            self.goaway_releases.clone(),
        );
        r.register(
            "goaway_lingering",
            "Routers let go after go-away, kept connected while a relayed connection through them carries a call",
            self.goaway_lingering.clone(),
        );
        r.register(
            "goaway_linger_ends",
            "How the connection to a router let go with calls through it ended, by reason (calls_done, deadline: calls cut, router_closed)",
            self.goaway_linger_ends.clone(),
        );
        r.register(
            "routers_replaced",
            "Held routers given up for another one, by reason",
            self.routers_replaced.clone(),
        );
        r.register(
            "auth_connection_retries",
            "Connections to a router retried after a backoff because the dial or the first auth's connection failed",
            self.auth_conn_retries.clone(),
        );
        r.register(
            "router_revoked_refusals",
            "Routers that refused our credential as revoked; each is passed over until the credential changes (at most 30 min)",
            self.router_revoked_refusals.clone(),
        );
        r.register(
            "credential_revoked",
            "1 while the control plane's signed revocation list held names this node's credential (it asks no router then)",
            self.credential_revoked.clone(),
        );
        r.register(
            "directory_fetches",
            "Directory fetches started, by schedule (interval, no_router, short_of_k)",
            self.directory_fetches.clone(),
        );
        r.register(
            "router_shuns_lifted",
            "Shuns of routers that had left ended because the directory showed them back",
            self.shuns_lifted.clone(),
        );
        r.register(
            "router_attaches_spread",
            "Attaches to routers put off by a random wait, by reason (replace: a lost router while another serves; rejoin: the other K - 1 once a node that had lost every router holds one again)",
            self.attaches_spread.clone(),
        );
    }
}
