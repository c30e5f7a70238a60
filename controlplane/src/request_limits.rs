//! Who may spend what, in which order: the one owner of every limit an RPC
//! passes before it is served. (Not to be confused with a router's
//! admission of a member over libp2p: these are the control plane's own
//! budgets and guards for gRPC requests.)
//!
//! Cheap checks go first and global budgets last, so a caller that fails a
//! check never spends what the callers who pass it need; and a caller that
//! proves who it is is never refused for what others at its address did.
//! Members share addresses (a NAT, a pod network), so the failure guard
//! punishes requests, not addresses: it refuses only a request that fails
//! to prove who sent it. Enroll, Refresh, RouterLease and Watch run:
//!
//! 0. **Decode** (tonic, before the handler): a request that does not
//!    decode is answered, counted and charged by [`crate::malformed`]: one
//!    token of its source's unauthenticated share and one failure for the
//!    guard; `INVALID_ARGUMENT`, or the guard's or budget's refusal with
//!    `retry-after`.
//! 1. **Nothing to verify** (free: no credential or no proof; no token or
//!    no proof for Enroll): from a source over its failures
//!    (`--auth-failures-per-source-per-min` this minute, [`FailureGuard`])
//!    it is refused by the guard at once, spending no budget; from another
//!    source it goes on and is refused, and counted, in step 3.
//! 2. **Unauthenticated budget** (`--unauth-rate-per-sec`; every RPC of the
//!    ControlPlane service but the admin ones, and every request that did
//!    not decode): a rate shared fairly by sources ([`FairRate`]) that pays
//!    for the work done before a caller is known: decoding, proof and
//!    credential signatures, GetKeys, GetDirectory. A lone source may use
//!    all of it; once more than half of its burst is spent, each active
//!    source gets at most its share.
//! 3. **Verify** (the proof, the credential's signature, in memory;
//!    [`RequestLimits::judge`]): a failure is counted against the source; once
//!    the source is over its limit the failure is answered as the guard's
//!    refusal, naming it, with the rest of the source's window as
//!    `retry-after`. A request that verifies passes whatever its source's
//!    count: refreshes, router leases and watches never depend on their
//!    address's failures.
//! 4. **Enroll's token, from a source over its limit**
//!    ([`RequestLimits::check_token`]): anyone can sign an enrollment proof, so
//!    only the token tells an attacker from a member, and only the database
//!    knows tokens. The token must be one the in-memory [`TokenIndex`]
//!    holds; a made-up one is refused here (a failure, answered by the
//!    guard), so an attacker over its limit reaches neither the enroll
//!    budget its NAT's members share nor the token lookup (a write of an
//!    `enrollment_requests` row). Under its limit a source's tokens are
//!    looked up in the database as always.
//! 5. **The call's own budget**, only for callers that passed: Enroll
//!    (`--enroll-rate-per-sec`) and Refresh (`--refresh-rate-per-sec`),
//!    each a [`SpreadingBucket`] shared fairly by sources, and RouterLease
//!    (`--lease-rate-per-sec`), a bucket only a verified router credential
//!    reaches, so members can never drain it. Then the database; its
//!    refusals (an unknown, expired or used-up token) are judged as in
//!    step 3.
//!
//! Admin RPCs run steps 1 and 3 on the bearer token (no header from a
//! source over its limit is refused at once; a wrong one is a failure; the
//! right one is served). So what the guard buys, now that it no longer
//! refuses before verification: free refusal of requests with nothing to
//! verify from a failing source; `retry-after` telling a failing source to
//! back off; made-up tokens kept from the enroll budget and the database;
//! and a per-source count of failures that shows who is failing
//! (`limiter_refusals_total{limiter="failure_guard"}`). The guard stays in
//! memory: counting a failure is O(1) and writes nothing.
//!
//! Connections have their own fair share (`--grpc-max-connections`, see
//! [`crate::grpc_limits`]); the slots live here too so their numbers are
//! reported with the rest. Every refusal is a [`ServiceError::Limited`]
//! naming its limit, or [`ServiceError::Blocked`] for the guard (counted
//! per limit in `limiter_refusals_total`), with a `retry-after`, and is
//! logged at most once a minute per source ([`RefusalLog`]). The budgets
//! and the guard's count are for the whole control plane: each of the N
//! live replicas serves 1/N of them ([`RequestLimits::set_replicas`],
//! N from [`crate::replicas`]); connection and stream slots are per
//! process.

use std::{
    future::Future,
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
    store::StoreError,
    token_index::{Digest, TokenIndex, Verdict},
};

/// Where a request without a remote address counts (in-process callers):
/// one source of its own.
const NO_ADDRESS: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

/// Every limit a request passes; see the module docs.
pub struct RequestLimits {
    clock: SharedClock,
    metrics: Metrics,
    log: RefusalLog,
    guard: Mutex<FailureGuard>,
    tokens: TokenIndex,
    unauth: Mutex<FairRate>,
    enroll: Mutex<SpreadingBucket>,
    refresh: Mutex<SpreadingBucket>,
    lease: Mutex<TokenBucket>,
    connections: FairSlots,
}

impl std::fmt::Debug for RequestLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestLimits").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RequestLimits {
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
            tokens: TokenIndex::new(
                config.token_index_max_tokens,
                Duration::from_secs(config.token_index_max_age_secs),
            ),
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

    /// Serves `1 / replicas` of every budget the whole control plane
    /// shares (unauthenticated, enroll, refresh, lease, and the failure
    /// guard's count): the replicas live now (see [`crate::replicas`])
    /// each hold an equal part, so the configured numbers hold for the
    /// control plane, not per process. Connection and stream slots stay
    /// per process: they bound this process's own memory.
    pub fn set_replicas(&self, replicas: u32) {
        lock(&self.unauth).set_share(replicas);
        lock(&self.enroll).set_share(replicas);
        lock(&self.refresh).set_share(replicas);
        lock(&self.lease).set_share(replicas);
        lock(&self.guard).set_share(replicas);
    }

    /// The connection slots (`--grpc-max-connections`), for the listener.
    pub fn connection_slots(&self) -> FairSlots {
        self.connections.clone()
    }

    /// The per-source log gate, for the listener's refusals.
    pub fn refusal_log(&self) -> RefusalLog {
        self.log.clone()
    }

    /// Step 1: a request that carries nothing to verify (it lacks `lacks`),
    /// from a source over its failure limit, is refused by the guard at
    /// once, spending no budget. From any other source it goes on, to be
    /// refused (and counted) where it is verified.
    pub fn refuse_unverifiable(
        &self,
        source: Option<IpAddr>,
        lacks: &str,
    ) -> Result<(), ServiceError> {
        let Some(ip) = source else { return Ok(()) };
        let blocked = lock(&self.guard).check(ip, self.clock.now());
        blocked.map_err(|b| {
            let cause = ServiceError::Invalid(format!("the request carries no {lacks}"));
            self.blocked(ip, b.wait, cause)
        })
    }

    /// Steps 3 and 5: the verdict on a request. A failure to prove who sent
    /// it ([`ServiceError::is_failure`]) is counted against its source and,
    /// when the source was already over its limit, answered as the guard's
    /// refusal (with the rest of its window as `retry-after`, naming the
    /// failure); anything else passes unchanged, so a caller that proved
    /// itself is never refused by its address's failures.
    pub fn judge<T>(
        &self,
        source: Option<IpAddr>,
        r: Result<T, ServiceError>,
    ) -> Result<T, ServiceError> {
        match r {
            Err(e) if e.is_failure() => Err(self.failed(source, e)),
            r => r,
        }
    }

    /// Counts a failure (`e`) against `source`; the error to answer with.
    fn failed(&self, source: Option<IpAddr>, e: ServiceError) -> ServiceError {
        let Some(ip) = source else { return e };
        let now = self.clock.now();
        let mut guard = lock(&self.guard);
        let over = guard.check(ip, now).err();
        guard.record_failure(ip, now);
        drop(guard);
        match over {
            Some(b) => self.blocked(ip, b.wait, e),
            None => e,
        }
    }

    /// Step 4 (Enroll): a token from a source over its failure limit must be
    /// one the [`TokenIndex`] holds; a made-up one is refused in memory,
    /// before the enroll budget and the database (counted as the failure
    /// it is). `load(limit)` reads the live token digests when the index
    /// needs loading. A source under its limit passes untouched.
    pub async fn check_token<F, Fut>(
        &self,
        source: Option<IpAddr>,
        digest: &Digest,
        load: F,
    ) -> Result<(), ServiceError>
    where
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = Result<Vec<Digest>, StoreError>>,
    {
        let Some(ip) = source else { return Ok(()) };
        let now = self.clock.now();
        let Err(over) = lock(&self.guard).check(ip, now) else {
            return Ok(());
        };
        let (verdict, loaded) = self.tokens.lookup(digest, now, load).await?;
        if let Some(l) = loaded {
            self.metrics.token_index_loaded(l.tokens, l.complete);
        }
        match verdict {
            Verdict::Held | Verdict::Incomplete => Ok(()),
            Verdict::Unknown { recheck_in } => {
                lock(&self.guard).record_failure(ip, now);
                let cause = ServiceError::unauth(
                    "unknown_token",
                    "token not recognised (this process rechecks the database for new tokens \
                     at most every --token-index-max-age-secs while the source is refused)",
                );
                Err(self.blocked(
                    ip,
                    over.wait.min(recheck_in.max(Duration::from_secs(1))),
                    cause,
                ))
            }
        }
    }

    /// A token was minted in this process: the token index loads again.
    pub fn token_minted(&self) {
        self.tokens.minted();
    }

    /// Takes the source's share of the unauthenticated budget.
    pub fn check_unauth(&self, source: Option<IpAddr>) -> Result<(), ServiceError> {
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
    pub fn check_enroll(&self, source: Option<IpAddr>) -> Result<(), ServiceError> {
        let ip = source.unwrap_or(NO_ADDRESS);
        let r = lock(&self.enroll).try_acquire(ip, self.clock.now());
        self.spread(ip, "enroll", "enroll_source_share", r)
    }

    /// Takes a Refresh token (after the credential verified).
    pub fn check_refresh(&self, source: Option<IpAddr>) -> Result<(), ServiceError> {
        let ip = source.unwrap_or(NO_ADDRESS);
        let r = lock(&self.refresh).try_acquire(ip, self.clock.now());
        self.spread(ip, "refresh", "refresh_source_share", r)
    }

    /// Takes a lease token (after a router credential verified), or refuses
    /// with the wait for the next one: a lease lives `--lease-ttl-secs`, so a
    /// router is told the next token, never a slot further ahead.
    pub fn check_lease(&self, source: Option<IpAddr>) -> Result<(), ServiceError> {
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
        self.log_refusal(ip, limiter, wait);
        ServiceError::Limited { limiter, wait }
    }

    /// The failure guard's refusal of a request that failed with `cause`.
    fn blocked(&self, ip: IpAddr, wait: Duration, cause: ServiceError) -> ServiceError {
        self.log_refusal(ip, "failure_guard", wait);
        ServiceError::Blocked {
            wait,
            cause: Box::new(cause),
        }
    }

    fn log_refusal(&self, ip: IpAddr, limiter: &'static str, wait: Duration) {
        if let Some(source) = self.log.due(ip) {
            tracing::warn!(
                %source,
                limiter,
                retry_after_secs = crate::limiter::retry_after_secs(wait),
                "request refused (logged once a minute per source; every refusal is counted \
                 in limiter_refusals_total)"
            );
        }
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
