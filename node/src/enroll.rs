//! Getting a credential at start-up: reuse the stored one while it is still
//! valid (no re-enrollment), else refresh it, else enroll with the token.

use agentmesh_controlplane::client::{Client, ClientConfig, Connections};
use agentmesh_proto::credential::peek_claims;
use agentmesh_proto::pb::credential::{Credential, KeySet};
use agentmesh_proto::unix_now;

use crate::SpawnError;
use crate::config::{Config, ControlPlaneConfig};
use crate::identity::{self, Stored};
use crate::metrics::Metrics;

/// A stored credential is reused (not refreshed, not re-enrolled) while it
/// has at least this long to live.
const MIN_REMAINING_SECS: i64 = 30;

/// The control-plane client a member uses, from the control-plane section:
/// the CA file read if given, and a connection per call (a member talks to
/// the control plane a few times an hour, so it holds none at rest).
pub(crate) async fn client(config: &ControlPlaneConfig) -> Result<Client, SpawnError> {
    let ca_pem = match &config.ca {
        Some(p) => Some(tokio::fs::read(p).await.map_err(|source| SpawnError::Ca {
            path: p.clone(),
            source,
        })?),
        None => None,
    };
    Ok(Client::with_endpoints(
        ClientConfig {
            url: config.url.clone(),
            ca_pem,
            retry_budget: config.retry_budget,
            rpc_timeout: config.rpc_timeout.max(crate::config::MIN_TIMEOUT),
        },
        Connections::PerCall,
        &config.endpoints,
    )?)
}

async fn store(config: &Config, cred: &Credential, keys: &KeySet) -> Result<(), SpawnError> {
    let (dir, c, k) = (config.data_dir.clone(), cred.clone(), keys.clone());
    tokio::task::spawn_blocking(move || {
        identity::store_credential(&dir, &c)?;
        identity::store_keys(&dir, &k)
    })
    .await
    .map_err(|e| SpawnError::Config(format!("identity task: {e}")))??;
    Ok(())
}

/// The credential and key set the node starts with.
pub(crate) async fn obtain(
    client: &Client,
    config: &Config,
    stored: &Stored,
    metrics: &Metrics,
) -> Result<(Credential, KeySet), SpawnError> {
    let peer = stored.key.public().to_peer_id().to_bytes();
    let mine = stored
        .credential
        .as_ref()
        .filter(|c| peek_claims(c).is_ok_and(|cl| cl.subject == peer));
    if let Some(cred) = mine {
        let expires = peek_claims(cred)
            .map(|c| c.expires_at_unix_secs)
            .unwrap_or(0);
        if expires > unix_now() + MIN_REMAINING_SECS {
            tracing::info!("reusing the stored credential (no re-enrollment)");
            return Ok((cred.clone(), stored.keys.clone().unwrap_or_default()));
        }
        // Expired or about to: the control plane refreshes just-expired ones.
        match client.refresh(cred, &stored.key).await {
            Ok(r) => {
                metrics.cp("refresh", true);
                let cred = r.credential.ok_or(SpawnError::NoCredential)?;
                let keys = r.keys.unwrap_or_default();
                store(config, &cred, &keys).await?;
                tracing::info!("refreshed the stored credential");
                return Ok((cred, keys));
            }
            Err(e) => {
                metrics.cp("refresh", false);
                if config.control_plane.token.is_empty() {
                    return Err(e.into());
                }
                tracing::warn!(error = %e, "stored credential not refreshed: enrolling with the token");
            }
        }
    }
    if config.control_plane.token.is_empty() {
        return Err(SpawnError::Config(
            "no valid credential in the data dir and no token to enroll with".into(),
        ));
    }
    let resp = client
        .enroll(&config.control_plane.token, &stored.key)
        .await
        .inspect_err(|_| metrics.cp("enroll", false))?;
    metrics.cp("enroll", true);
    let cred = resp.credential.ok_or(SpawnError::NoCredential)?;
    let keys = resp.keys.unwrap_or_default();
    store(config, &cred, &keys).await?;
    tracing::info!(node_id = %resp.node_id, "enrolled");
    Ok((cred, keys))
}
