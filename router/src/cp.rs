//! The router's side of the control plane: enroll with the router token,
//! then every lease interval (with jitter) refresh the credential when due,
//! lease, read the directory (routers and revocations) and the key set.
//! Unknown key ids seen by the auth protocol trigger a key fetch at most once
//! per [`KEY_FETCH_MIN_INTERVAL`]; a router that authenticates to us before
//! our directory names it triggers a directory fetch at most once per
//! [`DIRECTORY_REFRESH_MIN_INTERVAL`], so two routers started together mesh
//! at once instead of one lease interval later.

use std::sync::Arc;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientError, HeldPolicyVersion};
use agentmesh_proto::credential::{Trust, map_to_labels, peek_claims};
use agentmesh_proto::pb::controlplane::RouterLoad;
use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::unix_now;
use libp2p::identity::Keypair;
use libp2p::{Multiaddr, PeerId};
use parking_lot::RwLock;
use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::addrs::Addrs;
use crate::admission::Admissions;
use crate::config::{Config, Sizing};
use crate::directory::{Directory, DirectoryRouter};
use crate::metrics::Metrics;
use crate::owned::View;
use crate::readiness::ReadinessState;
use crate::tables::Handle;

/// Keys are fetched on an unknown key id at most this often (per process).
pub(crate) const KEY_FETCH_MIN_INTERVAL: Duration = Duration::from_secs(30);

/// Refresh the credential once this fraction of its lifetime has passed.
const REFRESH_AT_FRACTION: f64 = 0.6;

/// After a failed enrollment, wait at most this long before the next try.
const ENROLL_RETRY_MAX: Duration = Duration::from_secs(30);

/// Directory fetches asked for between lease rounds (a router we do not
/// know yet authenticated to us) are this far apart at least: routers
/// starting together cost the control plane at most four extra directory
/// reads a second per router, and a new router waits at most this long to
/// be dialled back.
pub(crate) const DIRECTORY_REFRESH_MIN_INTERVAL: Duration = Duration::from_millis(250);

/// The link to the control plane: the client, the key-fetch rate limit, and
/// what the control plane gave this router (its keys and revocations, this
/// router's credential). The credential has one writer, the control-plane
/// loop; the trust set is the swarm loop's (`crate::tables`): key fetches
/// here and the policy's revocation lists reach it as commands, and every
/// reader holds this view.
pub(crate) struct Link {
    pub(crate) client: Client,
    last_key_fetch: tokio::sync::Mutex<Option<Instant>>,
    /// The control plane's keys and revocations (read-only here).
    pub(crate) trust: View<Trust>,
    /// This router's credential, once enrolled.
    pub(crate) credential: RwLock<Option<Credential>>,
}

impl Link {
    /// Wraps a client and a view of the trust set; no credential yet.
    pub(crate) fn new(client: Client, trust: View<Trust>) -> Self {
        Self {
            client,
            last_key_fetch: tokio::sync::Mutex::new(None),
            trust,
            credential: RwLock::new(None),
        }
    }
}

/// What the control-plane loop (and a drain's last lease) works with.
#[derive(Clone)]
pub(crate) struct Cp {
    pub(crate) config: Arc<Config>,
    pub(crate) keypair: Keypair,
    pub(crate) sizing: Sizing,
    pub(crate) link: Arc<Link>,
    /// Installs keys in the trust set (the swarm loop's).
    pub(crate) tables: Handle,
    pub(crate) metrics: Metrics,
    pub(crate) admissions: Admissions,
    pub(crate) directory: Arc<Directory>,
    pub(crate) readiness: Arc<ReadinessState>,
    pub(crate) addrs: Arc<Addrs>,
    /// Takes the policy and revocations each directory fetch brings.
    pub(crate) policy: Arc<dyn TakePolicy>,
}

impl Cp {
    fn peer_id(&self) -> PeerId {
        self.keypair.public().to_peer_id()
    }
}

/// Where each directory fetch's policy and revocations go (the access
/// policy's `PolicyCtx`): verified, taken if newer, enforced at once. A
/// trait so this module, which the policy module uses for the trust it
/// holds, does not depend on it.
pub(crate) trait TakePolicy: Send + Sync {
    /// Takes what the control plane sent; `source` labels the metric.
    fn take<'a>(
        &'a self,
        policy: Option<&'a agentmesh_proto::pb::credential::SignedPolicy>,
        revocations: Option<&'a agentmesh_proto::pb::credential::SignedRevocations>,
        source: &'static str,
    ) -> futures::future::BoxFuture<'a, ()>;

    /// The `(epoch, version)` of the policy held (`(0, 0)`: none).
    fn held(&self) -> (u64, u64);
}

/// Fetches the key set unless it was fetched within
/// [`KEY_FETCH_MIN_INTERVAL`]; returns whether new keys were installed.
/// Concurrent callers wait for one fetch instead of each fetching.
pub(crate) async fn fetch_keys_rate_limited(
    link: &Link,
    tables: &Handle,
    metrics: &Metrics,
    deadline: Duration,
) -> bool {
    let mut last = link.last_key_fetch.lock().await;
    if last.is_some_and(|t| t.elapsed() < KEY_FETCH_MIN_INTERVAL) {
        return false;
    }
    *last = Some(Instant::now());
    match tokio::time::timeout(deadline, link.client.get_keys()).await {
        // Not installed in time (logged and counted by the handle): the
        // asker refuses this once; the next fetch installs them.
        Ok(Ok(keys)) => {
            let installed = tables.set_keys(keys).await.unwrap_or(false);
            metrics
                .cp
                .key_fetch
                .get_or_create(&[("result", "ok")])
                .inc();
            installed
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "key fetch failed");
            metrics
                .cp
                .key_fetch
                .get_or_create(&[("result", "error")])
                .inc();
            false
        }
        Err(_) => {
            tracing::warn!("key fetch timed out");
            metrics
                .cp
                .key_fetch
                .get_or_create(&[("result", "error")])
                .inc();
            false
        }
    }
}

/// Runs the control-plane loop until `cancel` fires.
pub(crate) async fn run(cp: Cp, cancel: CancellationToken) {
    let mut enroll_backoff = Duration::from_millis(500);
    loop {
        if cp.link.credential.read().is_none() {
            // Shutdown does not wait for an enrollment under way (its
            // retries can take the whole control-plane retry budget when
            // the control plane is unreachable).
            let enrolled = tokio::select! {
                _ = cancel.cancelled() => return,
                r = enroll(&cp) => r,
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
        sync_once(&cp).await;
        let mut last_directory = Instant::now();
        let next_round = Instant::now() + jitter(cp.config.control_plane.lease_interval);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep_until(next_round) => break,
                _ = cp.directory.refresh_wanted() => {
                    let at = last_directory + DIRECTORY_REFRESH_MIN_INTERVAL;
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep_until(at) => {}
                    }
                    directory(&cp).await;
                    last_directory = Instant::now();
                }
            }
        }
    }
}

async fn enroll(cp: &Cp) -> Result<(), ClientError> {
    let resp = cp
        .link
        .client
        .enroll(&cp.config.control_plane.token, &cp.keypair)
        .await?;
    if let Some(keys) = resp.keys {
        // A failure is logged and counted by the handle; the next round's
        // key sync installs them.
        let _ = cp.tables.set_keys(keys).await;
    }
    let has_keys = cp.link.trust.read().key_count() > 0;
    cp.readiness.update(|r| r.keys = has_keys);
    if let Some(claims) = resp.credential.as_ref().and_then(|c| peek_claims(c).ok()) {
        let allowed = agentmesh_proto::credential::labels_to_map(&claims.labels);
        for (k, v) in &cp.config.labels {
            if allowed.get(k) != Some(v) {
                tracing::error!(label = %format!("{k}={v}"), "the router token does not allow this label; leases will be refused");
            }
        }
    }
    *cp.link.credential.write() = resp.credential;
    tracing::info!(node_id = %resp.node_id, "router enrolled");
    Ok(())
}

/// One round: refresh when due, directory, lease, keys. The directory
/// (with the policy) comes before the lease, so a router is ready (its
/// first lease accepted) holding the policy, not denying all for a round.
async fn sync_once(cp: &Cp) {
    refresh_if_due(cp).await;
    directory(cp).await;
    lease(cp).await;
    match cp.link.client.get_keys().await {
        Ok(keys) => {
            let _ = cp.tables.set_keys(keys).await;
            cp.metrics
                .cp
                .key_fetch
                .get_or_create(&[("result", "ok")])
                .inc();
        }
        Err(e) => {
            tracing::warn!(error = %e, "key sync failed");
            cp.metrics
                .cp
                .key_fetch
                .get_or_create(&[("result", "error")])
                .inc();
        }
    }
    let has_keys = cp.link.trust.read().key_count() > 0;
    if has_keys {
        cp.readiness.update(|r| r.keys = true);
    }
}

async fn refresh_if_due(cp: &Cp) {
    let Some(cred) = cp.link.credential.read().clone() else {
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
    match cp.link.client.refresh(&cred, &cp.keypair).await {
        Ok(resp) => {
            if let Some(keys) = resp.keys {
                let _ = cp.tables.set_keys(keys).await;
            }
            if resp.credential.is_some() {
                *cp.link.credential.write() = resp.credential;
                tracing::info!("router credential refreshed");
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "credential refresh failed");
            if unix_now() > claims.expires_at_unix_secs {
                // Expired and not refreshable: enroll again next round.
                *cp.link.credential.write() = None;
            }
        }
    }
}

/// The load this router reports in its lease.
pub(crate) fn load(cp: &Cp) -> RouterLoad {
    let c = cp.admissions.read().counts();
    RouterLoad {
        attached_members: c.attached,
        transit_connections: c.transit,
        high_watermark: cp.sizing.high_watermark,
        low_watermark: cp.sizing.low_watermark,
    }
}

/// Sends one lease (with the current draining flag).
pub(crate) async fn lease(cp: &Cp) {
    let Some(cred) = cp.link.credential.read().clone() else {
        return;
    };
    let addrs: Vec<String> = cp
        .addrs
        .external
        .read()
        .iter()
        .map(|a| a.to_string())
        .collect();
    let labels = map_to_labels(&cp.config.labels);
    let draining = cp.readiness.get().draining;
    // A frozen replica costs one short attempt, then the next replica.
    let client = cp
        .link
        .client
        .with_attempt_timeout(cp.config.control_plane.lease_attempt_timeout());
    let result = client
        .router_lease(&cred, &cp.keypair, addrs, labels, load(cp), draining)
        .await;
    match result {
        Ok(_) => {
            cp.metrics.cp.lease.get_or_create(&[("result", "ok")]).inc();
            cp.readiness.update(|r| r.lease_accepted = true);
        }
        Err(e) => {
            tracing::warn!(error = %e, "lease refused or failed");
            cp.metrics
                .cp
                .lease
                .get_or_create(&[("result", "error")])
                .inc();
        }
    }
}

async fn directory(cp: &Cp) {
    // Naming the version held: an unchanged policy is not sent again.
    let held = match cp.policy.held() {
        (0, 0) => None,
        (epoch, version) => Some(HeldPolicyVersion { epoch, version }),
    };
    let dir = match cp.link.client.get_directory_holding(held.as_ref()).await {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "directory fetch failed");
            cp.metrics
                .cp
                .directory_sync
                .get_or_create(&[("result", "error")])
                .inc();
            return;
        }
    };
    cp.metrics
        .cp
        .directory_sync
        .get_or_create(&[("result", "ok")])
        .inc();
    let me = cp.peer_id();
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
        .filter(|r| r.peer != me)
        .collect();
    // The swarm loop adds the routers admitted now; not answered in time
    // (logged and counted by the handle), the set stays as it was until
    // the next fetch.
    let peers = routers.iter().map(|r| r.peer).collect();
    let _ = cp.tables.set_directory_routers(peers).await;
    *cp.directory.routers.write() = routers;
    // The policy and revocations: verified, taken if newer, enforced at
    // once (the watch brings the same sooner when the control plane has it).
    cp.policy
        .take(dir.policy.as_ref(), dir.revocations.as_ref(), "directory")
        .await;
    cp.directory.wake_mesh();
}

/// `d` ± 10%.
fn jitter(d: Duration) -> Duration {
    let f = rand::thread_rng().gen_range(0.9..1.1);
    d.mul_f64(f)
}
