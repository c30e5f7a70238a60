//! The state every RPC handler shares.

use std::{
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use agentmesh_proto::pb::controlplane::GetDirectoryResponse;

use crate::{
    clock::SharedClock,
    config::Config,
    keys::Keys,
    limiter::{FailureGuard, Refusal, SpreadingBucket},
    metrics::Metrics,
    status::ServiceError,
    store::Db,
};

/// Shared server state.
pub struct State {
    /// The configuration started with.
    pub config: Config,
    /// The endpoint string proofs must sign.
    pub public_url: String,
    /// Storage.
    pub db: Db,
    /// Signing keys.
    pub keys: Keys,
    /// Metrics.
    pub metrics: Metrics,
    /// The monotonic clock limiters read.
    pub clock: SharedClock,
    /// The admin bearer token, if admin RPCs are enabled.
    pub admin_token: Option<String>,
    enroll_bucket: Mutex<SpreadingBucket>,
    refresh_bucket: Mutex<SpreadingBucket>,
    failure_guard: Mutex<FailureGuard>,
    directory_cache: Mutex<Option<(Duration, GetDirectoryResponse)>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("public_url", &self.public_url)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    /// Builds the shared state.
    pub fn new(
        config: Config,
        public_url: String,
        db: Db,
        keys: Keys,
        metrics: Metrics,
        clock: SharedClock,
        admin_token: Option<String>,
    ) -> Arc<Self> {
        Arc::new(Self {
            enroll_bucket: Mutex::new(SpreadingBucket::new(
                config.enroll_rate_per_sec,
                config.enroll_burst,
                Duration::from_secs(config.enroll_max_retry_after_secs),
            )),
            refresh_bucket: Mutex::new(SpreadingBucket::new(
                config.refresh_rate_per_sec,
                config.refresh_burst,
                Duration::from_secs(config.refresh_max_retry_after_secs),
            )),
            failure_guard: Mutex::new(FailureGuard::new(
                config.enroll_failures_per_ip_per_min,
                config.failure_guard_max_ips,
            )),
            directory_cache: Mutex::new(None),
            config,
            public_url,
            db,
            keys,
            metrics,
            clock,
            admin_token,
        })
    }

    /// Takes an enroll token, or refuses with the wait until the slot the
    /// virtual queue assigns this caller (see [`SpreadingBucket`]).
    pub fn admit_enroll(&self) -> Result<(), ServiceError> {
        let r = lock(&self.enroll_bucket).try_acquire(self.clock.now());
        self.limited("enroll", r)
    }

    /// Takes a refresh/lease token, or refuses with the wait until this
    /// caller's slot.
    pub fn admit_refresh(&self) -> Result<(), ServiceError> {
        let r = lock(&self.refresh_bucket).try_acquire(self.clock.now());
        self.limited("refresh", r)
    }

    /// Takes a token for a router lease from the refresh limiter, or refuses
    /// with the wait for the next token, not a slot at the back of the queue:
    /// a lease lives `--lease-ttl-secs` (30 s) and the queue may reach
    /// `--refresh-max-retry-after-secs` ahead, so a router waiting its turn
    /// could drop out of the directory.
    pub fn admit_lease(&self) -> Result<(), ServiceError> {
        let r = lock(&self.refresh_bucket).try_acquire_unqueued(self.clock.now());
        self.limited("refresh", r)
    }

    fn limited(&self, limiter: &'static str, r: Result<(), Refusal>) -> Result<(), ServiceError> {
        r.map_err(|refusal| {
            self.metrics.retry_after(limiter, &refusal);
            ServiceError::Limited {
                limiter,
                wait: refusal.wait,
            }
        })
    }

    /// Refuses a source IP that has failed too often this minute.
    pub fn check_failures(&self, ip: Option<IpAddr>) -> Result<(), ServiceError> {
        let Some(ip) = ip else { return Ok(()) };
        lock(&self.failure_guard)
            .check(ip, self.clock.now())
            .map_err(|wait| ServiceError::Limited {
                limiter: "failure_guard",
                wait,
            })
    }

    /// Counts a failure from a source IP.
    pub fn record_failure(&self, ip: Option<IpAddr>) {
        if let Some(ip) = ip {
            lock(&self.failure_guard).record_failure(ip, self.clock.now());
        }
    }

    /// A cached directory answer younger than `--directory-cache-ms`.
    pub fn cached_directory(&self) -> Option<GetDirectoryResponse> {
        let now = self.clock.now();
        let max_age = Duration::from_millis(self.config.directory_cache_ms);
        lock(&self.directory_cache)
            .as_ref()
            .filter(|(at, _)| now.saturating_sub(*at) < max_age)
            .map(|(_, d)| d.clone())
    }

    /// Stores a directory answer.
    pub fn cache_directory(&self, d: &GetDirectoryResponse) {
        *lock(&self.directory_cache) = Some((self.clock.now(), d.clone()));
    }

    /// Drops the cached directory (after a lease or revocation changed it).
    pub fn invalidate_directory(&self) {
        *lock(&self.directory_cache) = None;
    }
}
