//! The router's side of the control plane: enroll with the router token,
//! then every lease interval (with jitter) refresh the credential when due,
//! lease, read the directory (routers and revocations) and the key set.
//! Unknown key ids seen by the auth protocol trigger a key fetch at most once
//! per [`KEY_FETCH_MIN_INTERVAL`].

use std::sync::Arc;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientError};
use agentmesh_proto::credential::{map_to_labels, peek_claims};
use agentmesh_proto::pb::controlplane::RouterLoad;
use agentmesh_proto::unix_now;
use libp2p::{Multiaddr, PeerId};
use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::state::{DirectoryRouter, Shared};

/// Keys are fetched on an unknown key id at most this often (per process).
pub(crate) const KEY_FETCH_MIN_INTERVAL: Duration = Duration::from_secs(30);

/// Refresh the credential once this fraction of its lifetime has passed.
const REFRESH_AT_FRACTION: f64 = 0.6;

/// After a failed enrollment, wait at most this long before the next try.
const ENROLL_RETRY_MAX: Duration = Duration::from_secs(30);

/// The control-plane client plus the key-fetch rate limit.
pub(crate) struct ControlPlane {
    client: Client,
    last_key_fetch: tokio::sync::Mutex<Option<Instant>>,
}

impl ControlPlane {
    /// Wraps a client.
    pub(crate) fn new(client: Client) -> Self {
        Self {
            client,
            last_key_fetch: tokio::sync::Mutex::new(None),
        }
    }
}

/// Fetches the key set unless it was fetched within
/// [`KEY_FETCH_MIN_INTERVAL`]; returns whether new keys were installed.
/// Concurrent callers wait for one fetch instead of each fetching.
pub(crate) async fn fetch_keys_rate_limited(shared: &Shared, deadline: Duration) -> bool {
    let mut last = shared.cp.last_key_fetch.lock().await;
    if last.is_some_and(|t| t.elapsed() < KEY_FETCH_MIN_INTERVAL) {
        return false;
    }
    *last = Some(Instant::now());
    match tokio::time::timeout(deadline, shared.cp.client.get_keys()).await {
        Ok(Ok(keys)) => {
            shared.trust.write().set_keys(&keys);
            shared
                .metrics
                .key_fetch
                .get_or_create(&[("result", "ok")])
                .inc();
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "key fetch failed");
            shared
                .metrics
                .key_fetch
                .get_or_create(&[("result", "error")])
                .inc();
            false
        }
        Err(_) => {
            tracing::warn!("key fetch timed out");
            shared
                .metrics
                .key_fetch
                .get_or_create(&[("result", "error")])
                .inc();
            false
        }
    }
}

/// Runs the control-plane loop until `cancel` fires.
pub(crate) async fn run(shared: Arc<Shared>, cancel: CancellationToken) {
    let mut enroll_backoff = Duration::from_millis(500);
    loop {
        if shared.credential.read().is_none() {
            // Shutdown does not wait for an enrollment under way (its
            // retries can take the whole control-plane retry budget when
            // the control plane is unreachable).
            let enrolled = tokio::select! {
                _ = cancel.cancelled() => return,
                r = enroll(&shared) => r,
            };
            match enrolled {
                Ok(()) => enroll_backoff = Duration::from_millis(500),
                Err(e) => {
                    tracing::warn!(error = %e, "router enrollment failed; retrying");
                    let wait = jitter(enroll_backoff);
                    enroll_backoff = (enroll_backoff * 2).min(ENROLL_RETRY_MAX);
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(wait) => continue,
                    }
                }
            }
        }
        sync_once(&shared).await;
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(jitter(shared.config.lease_interval)) => {}
        }
    }
}

async fn enroll(shared: &Shared) -> Result<(), ClientError> {
    let resp = shared
        .cp
        .client
        .enroll(&shared.config.token, &shared.keypair)
        .await?;
    if let Some(keys) = resp.keys.as_ref() {
        shared.trust.write().set_keys(keys);
    }
    let has_keys = shared.trust.read().key_count() > 0;
    shared.update_readiness(|r| r.keys = has_keys);
    if let Some(claims) = resp.credential.as_ref().and_then(|c| peek_claims(c).ok()) {
        let allowed = agentmesh_proto::credential::labels_to_map(&claims.labels);
        for (k, v) in &shared.config.labels {
            if allowed.get(k) != Some(v) {
                tracing::error!(label = %format!("{k}={v}"), "the router token does not allow this label; leases will be refused");
            }
        }
    }
    *shared.credential.write() = resp.credential;
    tracing::info!(node_id = %resp.node_id, "router enrolled");
    Ok(())
}

/// One round: refresh when due, lease, directory, keys.
async fn sync_once(shared: &Shared) {
    refresh_if_due(shared).await;
    lease(shared).await;
    directory(shared).await;
    match shared.cp.client.get_keys().await {
        Ok(keys) => {
            shared.trust.write().set_keys(&keys);
            shared
                .metrics
                .key_fetch
                .get_or_create(&[("result", "ok")])
                .inc();
        }
        Err(e) => {
            tracing::warn!(error = %e, "key sync failed");
            shared
                .metrics
                .key_fetch
                .get_or_create(&[("result", "error")])
                .inc();
        }
    }
    let has_keys = shared.trust.read().key_count() > 0;
    if has_keys {
        shared.update_readiness(|r| r.keys = true);
    }
}

async fn refresh_if_due(shared: &Shared) {
    let Some(cred) = shared.credential.read().clone() else {
        return;
    };
    let Ok(claims) = peek_claims(&cred) else {
        return;
    };
    let life = (claims.expires_at_unix_secs - claims.issued_at_unix_secs).max(1) as f64;
    let due = claims.issued_at_unix_secs + (life * REFRESH_AT_FRACTION) as i64;
    if unix_now() < due {
        return;
    }
    match shared.cp.client.refresh(&cred, &shared.keypair).await {
        Ok(resp) => {
            if let Some(keys) = resp.keys.as_ref() {
                shared.trust.write().set_keys(keys);
            }
            if resp.credential.is_some() {
                *shared.credential.write() = resp.credential;
                tracing::info!("router credential refreshed");
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "credential refresh failed");
            if unix_now() > claims.expires_at_unix_secs {
                // Expired and not refreshable: enroll again next round.
                *shared.credential.write() = None;
            }
        }
    }
}

/// The load this router reports in its lease.
pub(crate) fn load(shared: &Shared) -> RouterLoad {
    let c = shared.admission.read().counts();
    RouterLoad {
        attached_members: c.attached,
        transit_connections: c.transit,
        high_watermark: shared.sizing.high_watermark,
        low_watermark: shared.sizing.low_watermark,
    }
}

/// Sends one lease (with the current draining flag).
pub(crate) async fn lease(shared: &Shared) {
    let Some(cred) = shared.credential.read().clone() else {
        return;
    };
    let addrs: Vec<String> = shared
        .external_addrs
        .read()
        .iter()
        .map(|a| a.to_string())
        .collect();
    let labels = map_to_labels(&shared.config.labels);
    let draining = shared.readiness().draining;
    let result = shared
        .cp
        .client
        .router_lease(
            &cred,
            &shared.keypair,
            addrs,
            labels,
            load(shared),
            draining,
        )
        .await;
    match result {
        Ok(_) => {
            shared
                .metrics
                .lease
                .get_or_create(&[("result", "ok")])
                .inc();
            shared.update_readiness(|r| r.lease_accepted = true);
        }
        Err(e) => {
            tracing::warn!(error = %e, "lease refused or failed");
            shared
                .metrics
                .lease
                .get_or_create(&[("result", "error")])
                .inc();
        }
    }
}

async fn directory(shared: &Shared) {
    let dir = match shared.cp.client.get_directory().await {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "directory fetch failed");
            shared
                .metrics
                .directory_sync
                .get_or_create(&[("result", "error")])
                .inc();
            return;
        }
    };
    shared
        .metrics
        .directory_sync
        .get_or_create(&[("result", "ok")])
        .inc();
    let routers: Vec<DirectoryRouter> = dir
        .routers
        .iter()
        .filter_map(|r| {
            let peer = PeerId::from_bytes(&r.peer_id).ok()?;
            let addrs = r
                .addrs
                .iter()
                .filter_map(|a| a.parse::<Multiaddr>().ok())
                .collect();
            Some(DirectoryRouter {
                peer,
                addrs,
                draining: r.draining,
                load: r.load,
            })
        })
        .filter(|r| r.peer != shared.peer_id)
        .collect();
    let admitted_routers: Vec<PeerId> = shared.admission.read().routers().copied().collect();
    *shared.router_set.write() = routers
        .iter()
        .map(|r| r.peer)
        .chain(admitted_routers)
        .collect();
    *shared.directory.write() = routers;
    shared.trust.write().set_revocations(&dir.revocations);
}

/// `d` ± 10%.
fn jitter(d: Duration) -> Duration {
    let f = rand::thread_rng().gen_range(0.9..1.1);
    d.mul_f64(f)
}
