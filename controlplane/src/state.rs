//! The state every RPC handler shares.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use agentmesh_proto::pb::controlplane::GetDirectoryResponse;

use crate::{
    clock::SharedClock, config::Config, keys::Keys, metrics::Metrics,
    request_limits::RequestLimits, signed_policy::HeldPolicy,
    signed_revocations::RevocationsSigner, status::ServiceError, store::Db, watch_hub::WatchHub,
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
    /// Every limit a request passes, in order.
    pub limits: RequestLimits,
    /// The policy in force (deny-all until start-up reads the database).
    pub policy: HeldPolicy,
    /// The signed revocation list (see [`crate::signed_revocations`]).
    pub revocations: RevocationsSigner,
    /// The event routers' watches stream (see [`crate::watch`]).
    pub watch: WatchHub,
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
            limits: RequestLimits::new(&config, clock.clone(), metrics.clone()),
            policy: HeldPolicy::default(),
            revocations: RevocationsSigner::default(),
            watch: WatchHub::new(config.watch_max_streams),
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

    /// The revocation list as stored now, signed with the key that signs
    /// now (one database read; signed again only when the list or the key
    /// changed).
    pub async fn signed_revocations(
        &self,
        now: i64,
    ) -> Result<agentmesh_proto::pb::credential::SignedRevocations, ServiceError> {
        let stored = self.db.run(self.db.store().revocations()).await?;
        let signer = self.keys.signer(now).ok_or(ServiceError::NoSigningKey)?;
        Ok(self.revocations.signed(&stored, &signer, now))
    }

    /// Something the directory carries changed (a policy was applied or
    /// found applied by another process, or re-signed with a new key):
    /// the next GetDirectory builds a fresh answer carrying it. What pushes
    /// changes to routers hooks in here.
    pub fn notify_directory_changed(&self) {
        self.invalidate_directory();
        self.watch.changed();
    }
}
