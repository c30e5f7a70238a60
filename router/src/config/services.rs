//! What the router serves its members besides admission: relayed
//! circuits between them and the catalog of their services.

use std::time::Duration;

/// Default relay reservations one peer may hold at once. A member reserves
/// once per router (renewals replace it); the rest is room for a member that
/// reconnects while its old reservation is still being torn down.
pub const DEFAULT_RELAY_MAX_RESERVATIONS_PER_PEER: usize = 4;
/// Default relay circuits per peer.
pub const DEFAULT_RELAY_MAX_CIRCUITS_PER_PEER: usize = 1024;
/// Default relay circuits in total.
pub const DEFAULT_RELAY_MAX_CIRCUITS: usize = 16 * 1024;
/// Default circuit lifetime: one hour.
pub const DEFAULT_RELAY_CIRCUIT_DURATION_SECS: u64 = 3600;
/// Default bytes per circuit: 0 means unlimited.
pub const DEFAULT_RELAY_CIRCUIT_BYTES: u64 = 0;
/// Default reservation lifetime (members renew before it ends).
pub const DEFAULT_RELAY_RESERVATION_DURATION_SECS: u64 = 3600;
/// Default bound on concurrently served catalog streams.
pub const DEFAULT_CATALOG_MAX_INFLIGHT_STREAMS: usize = 256;
/// Default cap on records the router holds for its members.
pub const DEFAULT_CATALOG_MAX_RECORDS: usize = 10_000;
/// Default cap on providers in one lookup answer.
pub const DEFAULT_CATALOG_MAX_RESULTS: usize = 64;
/// Default time a member's lookup may spend asking other routers. Well
/// below a member's own deadline for the whole lookup (its call timeout,
/// 10 s), so the answer — local records plus whatever other routers sent in
/// time — reaches the member before it gives up and it can still ask its
/// next router.
pub const DEFAULT_CATALOG_REMOTE_LOOKUP_BUDGET_MS: u64 = 3_000;
/// Default time a provider search's non-empty answer is reused: short
/// beside the DHT's own staleness (records re-announced every 120 s, kept
/// 360 s), long enough that a storm of lookups runs one search per service.
pub const DEFAULT_CATALOG_PROVIDER_CACHE_MS: u64 = 5_000;

/// The relay v2 server (`crate::relay::config`): how many reservations and
/// circuits it holds, per peer and in total, and how long and how much one
/// carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayConfig {
    /// Relay reservations at most; `None` = the effective high watermark. Default none.
    pub max_reservations: Option<usize>,
    /// Relay reservations one peer may hold at once (at least 1). Default 4.
    pub max_reservations_per_peer: usize,
    /// Relay circuits at most in total. Default 16384.
    pub max_circuits: usize,
    /// Relay circuits at most per peer. Default 1024.
    pub max_circuits_per_peer: usize,
    /// Longest life of one circuit. Default 3600 s.
    pub circuit_duration: Duration,
    /// Bytes one circuit may carry; 0 = unlimited. Default 0.
    pub circuit_bytes: u64,
    /// Life of one relay reservation. Default 3600 s.
    pub reservation_duration: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            max_reservations: None,
            max_reservations_per_peer: DEFAULT_RELAY_MAX_RESERVATIONS_PER_PEER,
            max_circuits: DEFAULT_RELAY_MAX_CIRCUITS,
            max_circuits_per_peer: DEFAULT_RELAY_MAX_CIRCUITS_PER_PEER,
            circuit_duration: Duration::from_secs(DEFAULT_RELAY_CIRCUIT_DURATION_SECS),
            circuit_bytes: DEFAULT_RELAY_CIRCUIT_BYTES,
            reservation_duration: Duration::from_secs(DEFAULT_RELAY_RESERVATION_DURATION_SECS),
        }
    }
}

impl RelayConfig {
    /// Bytes per circuit for the relay (0 = unlimited becomes `u64::MAX`).
    pub fn effective_circuit_bytes(&self) -> u64 {
        if self.circuit_bytes == 0 {
            u64::MAX
        } else {
            self.circuit_bytes
        }
    }
}

/// The catalog: the records the router holds for its members, the
/// streams its server takes at once, and what one lookup may answer and
/// spend asking other routers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogConfig {
    /// Catalog streams served at once, shared like the auth streams;
    /// peers not admitted get none. Default 256.
    pub max_inflight_streams: usize,
    /// Member records held at most. Default 10000.
    pub max_records: usize,
    /// Providers in one lookup answer at most. Default 64.
    pub max_results: usize,
    /// Time one lookup may spend finding and asking other routers; what
    /// arrived by then is answered (counted as result "partial"); zero
    /// answers from this router's own records only. Default 3 s.
    pub remote_lookup_budget: Duration,
    /// How long a search's non-empty list of provider routers is reused by
    /// later lookups of the same service (zero: never; lookups running at
    /// the same time always share one search). Default 5 s.
    pub provider_cache: Duration,
}

impl Default for CatalogConfig {
    fn default() -> Self {
        Self {
            max_inflight_streams: DEFAULT_CATALOG_MAX_INFLIGHT_STREAMS,
            max_records: DEFAULT_CATALOG_MAX_RECORDS,
            max_results: DEFAULT_CATALOG_MAX_RESULTS,
            remote_lookup_budget: Duration::from_millis(DEFAULT_CATALOG_REMOTE_LOOKUP_BUDGET_MS),
            provider_cache: Duration::from_millis(DEFAULT_CATALOG_PROVIDER_CACHE_MS),
        }
    }
}
