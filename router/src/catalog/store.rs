//! The records of this router's own attached members, indexed by service.
//! Pure data: callers pass `now`. The swarm loop owns the one store
//! (`crate::tables`); the catalog server and the policy ask it to write
//! through [`RecordWriter`] and the tables' handle.

use std::collections::{HashMap, HashSet};

use agentmesh_proto::credential::Trust;
use agentmesh_proto::pb::mesh::{ServiceRecord, SignedRecord};
use futures::future::BoxFuture;
use libp2p::PeerId;

use crate::admission::AdmissionTable;
use crate::shrink::ShrinkSparse;

/// A record is kept at most this long past publication, whatever it claims;
/// members refresh theirs well before.
pub(crate) const MAX_RECORD_TTL_SECS: i64 = 3600;

/// Why a record was not stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StoreError {
    /// The store holds its maximum number of records.
    #[error("catalog is full ({0} records)")]
    Full(usize),
    /// The publisher is no longer admitted to attach (it left, or was
    /// dropped, between the server's check and the owner's write).
    #[error("publish needs an admitted attach")]
    NotAdmitted,
}

/// A verified record to store for `provider`, who published it.
#[derive(Debug)]
pub(crate) struct Publish {
    pub(crate) provider: PeerId,
    pub(crate) signed: SignedRecord,
    pub(crate) record: ServiceRecord,
    pub(crate) now: i64,
}

/// Why a write was not done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WriteError {
    /// The store refused it.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store's owner did not answer in time, or is gone.
    #[error("{0}")]
    Unanswered(String),
}

/// Asks the store's owner to write. A trait so the catalog does not depend
/// on the module that owns its store (`crate::tables` implements it).
pub(crate) trait RecordWriter: Send + Sync {
    /// Stores (or replaces) a record; when it expires here.
    fn publish(&self, p: Publish) -> BoxFuture<'_, Result<i64, WriteError>>;
    /// Drops `provider`'s record.
    fn withdraw(&self, provider: PeerId) -> BoxFuture<'_, Result<(), WriteError>>;
}

/// Which records a policy change keeps: `keep(provider, record, trust,
/// admissions)`, called by the store's owner with the trust set and the
/// admission table as it holds them.
pub(crate) type Keep = dyn FnMut(&PeerId, &SignedRecord, &Trust, &AdmissionTable) -> bool + Send;

/// A [`Keep`] on its way to the store's owner.
pub(crate) struct RecordFilter(pub(crate) Box<Keep>);

impl std::fmt::Debug for RecordFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordFilter")
    }
}

#[derive(Debug, Clone)]
struct Stored {
    signed: SignedRecord,
    services: Vec<String>,
    expires: i64,
}

/// Records by provider, and providers by service name.
#[derive(Debug)]
pub(crate) struct CatalogStore {
    max_records: usize,
    by_provider: HashMap<PeerId, Stored>,
    by_service: HashMap<String, HashSet<PeerId>>,
}

impl CatalogStore {
    /// An empty store holding at most `max_records` records.
    pub(crate) fn new(max_records: usize) -> Self {
        Self {
            max_records,
            by_provider: HashMap::new(),
            by_service: HashMap::new(),
        }
    }

    /// Stores (or replaces) `provider`'s record; returns when it expires here.
    pub(crate) fn publish(
        &mut self,
        provider: PeerId,
        signed: SignedRecord,
        record: &ServiceRecord,
        now: i64,
    ) -> Result<i64, StoreError> {
        if !self.by_provider.contains_key(&provider) && self.by_provider.len() >= self.max_records {
            return Err(StoreError::Full(self.max_records));
        }
        self.remove(&provider);
        let expires = record
            .expires_at_unix_secs
            .min(now.saturating_add(MAX_RECORD_TTL_SECS));
        let mut services = record.services.clone();
        services.sort();
        services.dedup();
        for s in &services {
            self.by_service
                .entry(s.clone())
                .or_default()
                .insert(provider);
        }
        self.by_provider.insert(
            provider,
            Stored {
                signed,
                services,
                expires,
            },
        );
        Ok(expires)
    }

    /// Drops `provider`'s record; returns whether there was one.
    pub(crate) fn remove(&mut self, provider: &PeerId) -> bool {
        let removed = self.by_provider.remove(provider);
        self.by_provider.shrink_sparse();
        let Some(old) = removed else {
            return false;
        };
        for s in &old.services {
            if let Some(set) = self.by_service.get_mut(s) {
                set.remove(provider);
                set.shrink_sparse();
                if set.is_empty() {
                    self.by_service.remove(s);
                    self.by_service.shrink_sparse();
                }
            }
        }
        true
    }

    /// Drops every record `keep(provider, signed)` says no to; returns the
    /// providers dropped (a policy change: records no longer owned).
    pub(crate) fn retain(
        &mut self,
        mut keep: impl FnMut(&PeerId, &SignedRecord) -> bool,
    ) -> Vec<PeerId> {
        let gone: Vec<PeerId> = self
            .by_provider
            .iter()
            .filter(|(p, r)| !keep(p, &r.signed))
            .map(|(p, _)| *p)
            .collect();
        for p in &gone {
            self.remove(p);
        }
        gone
    }

    /// Drops expired records; returns how many.
    pub(crate) fn expire(&mut self, now: i64) -> usize {
        let gone: Vec<PeerId> = self
            .by_provider
            .iter()
            .filter(|(_, r)| r.expires < now)
            .map(|(p, _)| *p)
            .collect();
        for p in &gone {
            self.remove(p);
        }
        gone.len()
    }

    /// Up to `limit` live records that name `service`.
    ///
    /// Each comes with its provider: records are verified once, when
    /// published (the provider is the peer that published it), so a lookup
    /// need not check a signature again (an ed25519 verify per record per
    /// lookup was 6% of a router's CPU while a fleet joined).
    pub(crate) fn lookup(
        &self,
        service: &str,
        now: i64,
        limit: usize,
    ) -> Vec<(PeerId, SignedRecord)> {
        let Some(providers) = self.by_service.get(service) else {
            return Vec::new();
        };
        providers
            .iter()
            .filter_map(|p| self.by_provider.get(p).map(|r| (*p, r)))
            .filter(|(_, r)| r.expires >= now)
            .take(limit)
            .map(|(p, r)| (p, r.signed.clone()))
            .collect()
    }

    /// Service names held.
    pub(crate) fn services(&self) -> impl Iterator<Item = &String> {
        self.by_service.keys()
    }

    /// Whether some record names `service`.
    pub(crate) fn has_service(&self, service: &str) -> bool {
        self.by_service.contains_key(service)
    }

    /// Records held.
    pub(crate) fn len(&self) -> usize {
        self.by_provider.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(p: &PeerId, services: &[&str], exp: i64) -> (ServiceRecord, SignedRecord) {
        let r = ServiceRecord {
            provider: p.to_bytes(),
            services: services.iter().map(|s| s.to_string()).collect(),
            routers: vec![],
            issued_at_unix_secs: 0,
            expires_at_unix_secs: exp,
            credential: None,
        };
        let s = SignedRecord {
            record: p.to_bytes(),
            signature: vec![],
        };
        (r, s)
    }

    #[test]
    fn publish_replace_lookup_remove() {
        let mut st = CatalogStore::new(10);
        let (a, b) = (PeerId::random(), PeerId::random());
        let (ra, sa) = rec(&a, &["echo", "echo", "kv"], 100);
        st.publish(a, sa, &ra, 0).expect("stored");
        let (rb, sb) = rec(&b, &["echo"], 100);
        st.publish(b, sb, &rb, 0).expect("stored");
        assert_eq!(st.lookup("echo", 10, 10).len(), 2);
        assert_eq!(st.lookup("echo", 10, 1).len(), 1, "limit applies");
        let kv = st.lookup("kv", 10, 10);
        assert_eq!(kv.len(), 1);
        assert_eq!(kv[0].0, a, "a lookup names the peer that published");
        // Replacing a's record drops its old services.
        let (ra2, sa2) = rec(&a, &["web"], 100);
        st.publish(a, sa2, &ra2, 0).expect("replaced");
        assert!(st.lookup("kv", 10, 10).is_empty());
        assert_eq!(st.len(), 2);
        assert!(st.remove(&b));
        assert!(st.lookup("echo", 10, 10).is_empty());
        let mut names: Vec<_> = st.services().cloned().collect();
        names.sort();
        assert_eq!(names, vec!["web".to_string()]);
    }

    #[test]
    fn expiry_and_ttl_cap() {
        let mut st = CatalogStore::new(10);
        let a = PeerId::random();
        let (r, s) = rec(&a, &["echo"], i64::MAX);
        let exp = st.publish(a, s, &r, 1000).expect("stored");
        assert_eq!(exp, 1000 + MAX_RECORD_TTL_SECS);
        assert_eq!(st.expire(exp), 0);
        assert_eq!(st.expire(exp + 1), 1);
        assert_eq!(st.len(), 0);
        assert_eq!(st.services().count(), 0);
    }

    #[test]
    fn full_store_refuses_new_providers_but_accepts_updates() {
        let mut st = CatalogStore::new(1);
        let (a, b) = (PeerId::random(), PeerId::random());
        let (ra, sa) = rec(&a, &["echo"], 100);
        st.publish(a, sa.clone(), &ra, 0).expect("stored");
        let (rb, sb) = rec(&b, &["echo"], 100);
        assert_eq!(st.publish(b, sb, &rb, 0), Err(StoreError::Full(1)));
        assert!(st.publish(a, sa, &ra, 0).is_ok());
    }
}
