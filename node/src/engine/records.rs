//! Our service records: signed, carrying our credential (so anyone with
//! the control plane's keys checks offline that we own what they name; a
//! record never outlives the credential in it, and a refreshed credential
//! is republished at once), naming the routers we are reserved on
//! (those leaving left out while others are reserved), published to each
//! reserved router, re-published when they change, a third of the way
//! through their TTL and shortly after a refusal; withdrawn at shutdown.

use std::time::Duration;

use agentmesh_proto::credential::peek_claims;
use agentmesh_proto::pb::credential::Credential;
use agentmesh_proto::pb::mesh::ServiceRecord;
use agentmesh_proto::record::sign_record;
use agentmesh_proto::unix_now;
use libp2p::PeerId;
use tokio::time::Instant;

use agentmesh_wire::catalog::{self, CatalogAnswer, CatalogError};

use super::{Engine, Op, jittered};

/// Where our records stand.
#[derive(Debug, Default)]
pub(crate) struct Records {
    /// They changed (routers, a refusal): publish at the next tick.
    pub(crate) dirty: bool,
    /// When they were last published.
    pub(crate) last_publish: Option<Instant>,
    /// A publication was refused: publish again at this instant.
    pub(crate) retry_at: Option<Instant>,
    /// Withdrawals sent at shutdown and not yet answered.
    pub(crate) withdraws_pending: usize,
}

impl Records {
    /// Whether a publication is due at `now` with records valid for `ttl`:
    /// changed, a third of the TTL old, or a retry due (which marks them
    /// changed).
    pub(crate) fn due(&mut self, now: Instant, ttl: Duration) -> bool {
        if self.retry_at.is_some_and(|t| t <= now) {
            self.retry_at = None;
            self.dirty = true;
        }
        let stale = self
            .last_publish
            .is_some_and(|t| now.saturating_duration_since(t) >= ttl / 3);
        self.dirty || stale
    }
}

/// A record published at `now` lives `ttl`, never beyond the credential
/// it carries (a caller or router would refuse it: `outlives_credential`).
/// A credential whose claims cannot be read gives `now + ttl` (the record
/// is refused on its credential anyway).
pub(crate) fn record_expiry(now: i64, ttl: Duration, credential: &Credential) -> i64 {
    let wanted = now + ttl.as_secs() as i64;
    peek_claims(credential).map_or(wanted, |c| wanted.min(c.expires_at_unix_secs))
}

impl Engine {
    /// Signs our record naming the reserved routers (but those leaving, when
    /// others are reserved) and publishes it to each reserved router.
    pub(super) fn publish_records(&mut self) {
        self.records.dirty = false;
        let services: Vec<String> = self
            .node
            .config
            .services
            .expose
            .iter()
            .map(|(n, _)| n.clone())
            .collect();
        let reserved = self.reserved_peers();
        if services.is_empty() || reserved.is_empty() {
            return;
        }
        // Routers that sent go-away are left out of the record while another
        // one is reserved: new callers route around them (they still hold
        // the record and carry calls already on them until they close).
        let staying: Vec<PeerId> = reserved
            .iter()
            .filter(|p| self.slots.get(p).is_some_and(|s| s.leaving.is_none()))
            .copied()
            .collect();
        let named = if staying.is_empty() {
            &reserved
        } else {
            &staying
        };
        let now = unix_now();
        let credential = self.node.credential();
        let record = ServiceRecord {
            provider: self.node.peer_id.to_bytes(),
            services,
            routers: named.iter().map(|p| p.to_bytes()).collect(),
            issued_at_unix_secs: now,
            expires_at_unix_secs: record_expiry(
                now,
                self.node.config.services.record_ttl,
                &credential,
            ),
            credential: Some(credential),
        };
        let signed = sign_record(&record, &self.node.key);
        self.records.last_publish = Some(Instant::now());
        for router in reserved {
            let node = self.node.clone();
            let req = catalog::publish(signed.clone());
            self.ops.push(Box::pin(async move {
                let result = catalog::request(
                    node.control.clone(),
                    router,
                    req,
                    node.config.call_timeout(),
                )
                .await;
                Op::Publish { router, result }
            }));
        }
    }

    pub(super) fn on_published(
        &mut self,
        router: PeerId,
        result: Result<CatalogAnswer, CatalogError>,
    ) {
        let ok = matches!(&result, Ok(CatalogAnswer::Ack(_)));
        let label = if ok { "ok" } else { "error" };
        self.node
            .metrics
            .routers
            .publishes
            .get_or_create(&crate::metrics::ResultLabel { result: label })
            .inc();
        if !ok {
            tracing::warn!(%router, ?result, "record publication not accepted");
        }
        if let Some(slot) = self.slots.get_mut(&router) {
            slot.published = ok;
            match &result {
                Ok(CatalogAnswer::Ack(_)) => slot.records_refused = None,
                // Its words (e.g. `not_owner: provider does not own service
                // "x"`), for the status: bounded, it is the router's text.
                Ok(CatalogAnswer::Refused(why)) => {
                    slot.records_refused = Some(super::bounded(why.clone()));
                }
                _ => {}
            }
        }
        if ok {
            self.release_leaving();
        } else if self.records.retry_at.is_none() {
            // Try again shortly (all routers: the record names them all).
            self.records.retry_at = Some(Instant::now() + jittered(Duration::from_secs(5), 0.5));
        }
        self.publish_status();
    }

    /// Shutdown: withdraw our records from every reserved router.
    pub(super) fn withdraw_all(&mut self) {
        if self.node.config.services.expose.is_empty() {
            return;
        }
        for router in self.reserved_peers() {
            let node = self.node.clone();
            let req = catalog::withdraw();
            self.records.withdraws_pending += 1;
            self.ops.push(Box::pin(async move {
                if let Err(e) = catalog::request(
                    node.control.clone(),
                    router,
                    req,
                    node.config.call_timeout(),
                )
                .await
                {
                    tracing::debug!(%router, error = %e, "withdraw failed");
                }
                Op::Withdrawn
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_never_outlives_its_credential() {
        let cred = |expires| {
            let claims = agentmesh_proto::pb::credential::Claims {
                expires_at_unix_secs: expires,
                ..Default::default()
            };
            let key = libp2p::identity::ed25519::Keypair::generate();
            agentmesh_proto::credential::sign(&claims, &key)
        };
        let ttl = Duration::from_secs(300);
        assert_eq!(record_expiry(1000, ttl, &cred(5000)), 1300);
        assert_eq!(record_expiry(1000, ttl, &cred(1100)), 1100);
        // Empty claims expire at 0: so does the record (refused anyway).
        assert_eq!(record_expiry(1000, ttl, &Credential::default()), 0);
    }

    #[test]
    fn records_are_published_when_changed_stale_or_retried() {
        let now = Instant::now();
        let ttl = Duration::from_secs(30);
        let mut r = Records::default();
        assert!(!r.due(now, ttl), "nothing published, nothing changed");
        r.dirty = true;
        assert!(r.due(now, ttl));
        r.dirty = false;
        r.last_publish = Some(now);
        assert!(!r.due(now + Duration::from_secs(9), ttl));
        assert!(r.due(now + Duration::from_secs(10), ttl));
        r.retry_at = Some(now + Duration::from_secs(5));
        assert!(!r.due(now + Duration::from_secs(4), ttl));
        assert!(r.due(now + Duration::from_secs(5), ttl));
        assert!(
            r.dirty && r.retry_at.is_none(),
            "a due retry marks them changed"
        );
    }
}
