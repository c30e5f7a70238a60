//! Who may spend what, in which order: the one owner of every limit an RPC
//! passes before it is served.
//!
//! Cheap checks go first and global budgets last, so a caller that fails a
//! check never spends what the callers who pass it need:
//!
//! 1. **Failure guard** ([`FailureGuard`]; Enroll, Refresh, RouterLease,
//!    admin): a source that failed authentication
//!    `--auth-failures-per-source-per-min` times this minute is refused at
//!    once, before anything else is looked at.
//! 2. **Unauthenticated budget** (`--unauth-rate-per-sec`; every RPC of
//!    the ControlPlane service but the admin ones): a rate shared fairly by
//!    sources ([`FairRate`]) that pays for the work done before a caller is
//!    known: decoding, proof and credential signatures, GetKeys,
//!    GetDirectory. A lone source may use all of it; once more than half
//!    of its burst is spent, each active source gets at most its share.
//! 3. **Decode and verify** (in the handlers): a failure is recorded
//!    against the source in the failure guard.
//! 4. **The call's own budget**, only for callers that passed: Enroll
//!    (`--enroll-rate-per-sec`) and Refresh (`--refresh-rate-per-sec`),
//!    each a [`SpreadingBucket`] shared fairly by sources, and RouterLease
//!    (`--lease-rate-per-sec`), a bucket only a verified router credential
//!    reaches, so members can never drain it.
//!
//! Connections have their own fair share (`--grpc-max-connections`, see
//! [`crate::grpc_limits`]); the slots live here too so their numbers are
//! reported with the rest. Every refusal is a [`ServiceError::Limited`]
//! naming its limit (counted per limit in `limiter_refusals_total`) with a
//! `retry-after`, and is logged at most once a minute per source
//! ([`RefusalLog`]). All limits are per control-plane process.

use std::{
    net::{IpAddr, Ipv6Addr},
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use agentmesh_fair::{FairRate, FairSlots, MapStats, RateReason, SourceKey};

use crate::{
    clock::SharedClock,
    config::Config,
    guard::FailureGuard,
    limiter::{Refusal, SOURCE_ACTIVE, SpreadingBucket, TokenBucket},
    metrics::Metrics,
    refusal_log::RefusalLog,
    status::ServiceError,
};

/// Where a request without a remote address counts (in-process callers):
/// one source of its own.
const NO_ADDRESS: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

/// Every limit a request passes; see the module docs.
pub struct Admission {
    clock: SharedClock,
    metrics: Metrics,
    log: RefusalLog,
    guard: Mutex<FailureGuard>,
    unauth: Mutex<FairRate>,
    enroll: Mutex<SpreadingBucket>,
    refresh: Mutex<SpreadingBucket>,
    lease: Mutex<TokenBucket>,
    connections: FairSlots,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Admission {
    /// Every limit as configured.
    pub fn new(config: &Config, clock: SharedClock, metrics: Metrics) -> Self {
        let sources = config.source_table_max_sources;
        let v6 = config.ipv6_source_prefix_len;
        Self {
            log: RefusalLog::new(sources, v6, clock.clone()),
            guard: Mutex::new(FailureGuard::new(
                config.auth_failures_per_source_per_min,
                config.failure_guard_max_sources,
                v6,
            )),
            unauth: Mutex::new(FairRate::new(
                config.unauth_rate_per_sec,
                config.unauth_burst,
                SOURCE_ACTIVE,
                sources,
                v6,
            )),
            enroll: Mutex::new(SpreadingBucket::new(
                config.enroll_rate_per_sec,
                config.enroll_burst,
                Duration::from_secs(config.enroll_max_retry_after_secs),
                sources,
                v6,
            )),
            refresh: Mutex::new(SpreadingBucket::new(
                config.refresh_rate_per_sec,
                config.refresh_burst,
                Duration::from_secs(config.refresh_max_retry_after_secs),
                sources,
                v6,
            )),
            lease: Mutex::new(TokenBucket::new(
                config.lease_rate_per_sec,
                config.lease_burst,
            )),
            connections: FairSlots::new(config.grpc_max_connections, sources, v6),
            clock,
            metrics,
        }
    }

    /// The connection slots (`--grpc-max-connections`), for the listener.
    pub fn connection_slots(&self) -> FairSlots {
        self.connections.clone()
    }

    /// The per-source log gate, for the listener's refusals.
    pub fn refusal_log(&self) -> RefusalLog {
        self.log.clone()
    }

    /// Refuses a source that failed authentication too often this minute.
    pub fn check_failures(&self, source: Option<IpAddr>) -> Result<(), ServiceError> {
        let Some(ip) = source else { return Ok(()) };
        lock(&self.guard)
            .check(ip, self.clock.now())
            .map_err(|b| self.refused(ip, "failure_guard", b.wait))
    }

    /// Counts a failed authentication (or malformed request) against its source.
    pub fn record_failure(&self, source: Option<IpAddr>) {
        if let Some(ip) = source {
            lock(&self.guard).record_failure(ip, self.clock.now());
        }
    }

    /// Takes the source's share of the unauthenticated budget.
    pub fn admit_unauth(&self, source: Option<IpAddr>) -> Result<(), ServiceError> {
        let ip = source.unwrap_or(NO_ADDRESS);
        let r = lock(&self.unauth).try_acquire(ip, self.clock.now());
        r.map(drop).map_err(|r| {
            let limiter = match r.reason {
                RateReason::Global => "unauth",
                RateReason::FairShare => "unauth_source_share",
            };
            self.refused(ip, limiter, r.wait)
        })
    }

    /// Takes an Enroll token (after the proof verified), or refuses with
    /// the wait until the slot this caller's source queue assigns it.
    pub fn admit_enroll(&self, source: Option<IpAddr>) -> Result<(), ServiceError> {
        let ip = source.unwrap_or(NO_ADDRESS);
        let r = lock(&self.enroll).try_acquire(ip, self.clock.now());
        self.spread(ip, "enroll", "enroll_source_share", r)
    }

    /// Takes a Refresh token (after the credential verified).
    pub fn admit_refresh(&self, source: Option<IpAddr>) -> Result<(), ServiceError> {
        let ip = source.unwrap_or(NO_ADDRESS);
        let r = lock(&self.refresh).try_acquire(ip, self.clock.now());
        self.spread(ip, "refresh", "refresh_source_share", r)
    }

    /// Takes a lease token (after a router credential verified), or refuses
    /// with the wait for the next one: a lease lives `--lease-ttl-secs`, so a
    /// router is told the next token, never a slot further ahead.
    pub fn admit_lease(&self, source: Option<IpAddr>) -> Result<(), ServiceError> {
        let ip = source.unwrap_or(NO_ADDRESS);
        let r = lock(&self.lease).try_acquire(self.clock.now());
        r.map_err(|wait| self.refused(ip, "lease", wait))
    }

    fn spread(
        &self,
        ip: IpAddr,
        global: &'static str,
        share: &'static str,
        r: Result<SourceKey, Refusal>,
    ) -> Result<(), ServiceError> {
        r.map(drop).map_err(|refusal| {
            self.metrics.retry_after(global, &refusal);
            let limiter = match refusal.reason {
                RateReason::Global => global,
                RateReason::FairShare => share,
            };
            self.refused(ip, limiter, refusal.wait)
        })
    }

    /// The error for a refusal by `limiter`, logged at most once a minute
    /// per source (the metric is counted where the error becomes a status).
    fn refused(&self, ip: IpAddr, limiter: &'static str, wait: Duration) -> ServiceError {
        if let Some(source) = self.log.due(ip) {
            tracing::warn!(
                %source,
                limiter,
                retry_after_secs = crate::limiter::retry_after_secs(wait),
                "request refused (logged once a minute per source; every refusal is counted \
                 in limiter_refusals_total)"
            );
        }
        ServiceError::Limited { limiter, wait }
    }

    /// Each source table's numbers, by its `table` label.
    pub fn source_tables(&self) -> [(&'static str, MapStats); 5] {
        [
            ("unauth", lock(&self.unauth).source_stats()),
            ("enroll", lock(&self.enroll).source_stats()),
            ("refresh", lock(&self.refresh).source_stats()),
            ("failure_guard", lock(&self.guard).source_stats()),
            ("connections", self.connections.source_stats()),
        ]
    }
}
