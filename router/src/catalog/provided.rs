//! The service keys this router announces in the router DHT, kept equal to
//! the service names its catalog holds.
//!
//! Reconciling runs in the swarm loop on every catalog change (every member
//! that leaves may change it), so it stays cheap: it only compares the
//! store's names with what is announced (hash-map lookups; the loop is the
//! store's only writer, so its read blocks no reader); SHA-256 keys are
//! computed for new names only, and remembered
//! per name until the name goes. A key that `start_providing` refuses (the
//! store already holds `MAX_PROVIDED_KEYS` distinct keys, other routers'
//! included) is not remembered as announced, so the next reconcile tries it
//! again; every refusal is counted by the caller.

use std::collections::HashMap;

use libp2p::kad::{self, RecordKey, store::MemoryStore};

use super::service_key;
use super::store::CatalogStore;
use crate::shrink::ShrinkSparse;

/// What one reconcile did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Keys newly announced (or re-announced).
    pub(crate) started: usize,
    /// Keys no longer announced.
    pub(crate) stopped: usize,
    /// Keys the DHT store refused (left to retry).
    pub(crate) failed: usize,
}

/// The names announced, each with its key.
#[derive(Debug, Default)]
pub(crate) struct Provided {
    announced: HashMap<String, RecordKey>,
    /// Names the last reconcile could not announce.
    unannounced: usize,
}

impl Provided {
    /// Whether the last reconcile left names unannounced (worth a retry
    /// even without a catalog change: other routers' keys expire).
    pub(crate) fn has_unannounced(&self) -> bool {
        self.unannounced > 0
    }

    /// Announces exactly the names `catalog` holds in `kad`; with `all`,
    /// re-announces every one (a router joined).
    pub(crate) fn reconcile(
        &mut self,
        catalog: &CatalogStore,
        all: bool,
        kad: &mut kad::Behaviour<MemoryStore>,
    ) -> Outcome {
        self.reconcile_with(catalog, all, kad, service_key)
    }

    /// [`Self::reconcile`] with the key function given (tests count calls).
    fn reconcile_with(
        &mut self,
        c: &CatalogStore,
        all: bool,
        kad: &mut kad::Behaviour<MemoryStore>,
        key_of: impl Fn(&str) -> RecordKey,
    ) -> Outcome {
        let (new, gone): (Vec<String>, Vec<String>) = {
            let new = c
                .services()
                .filter(|s| !self.announced.contains_key(s.as_str()))
                .cloned()
                .collect();
            let gone = self
                .announced
                .keys()
                .filter(|n| !c.has_service(n))
                .cloned()
                .collect();
            (new, gone)
        };
        let mut out = Outcome::default();
        for name in gone {
            if let Some(k) = self.announced.remove(&name) {
                kad.stop_providing(&k);
                out.stopped += 1;
            }
        }
        self.announced.shrink_sparse();
        if all {
            let mut refused = Vec::new();
            for (name, k) in &self.announced {
                match kad.start_providing(k.clone()) {
                    Ok(_) => out.started += 1,
                    Err(_) => refused.push(name.clone()),
                }
            }
            out.failed += refused.len();
            for name in refused {
                self.announced.remove(&name);
            }
        }
        let mut last_error = None;
        for name in new {
            let k = key_of(&name);
            match kad.start_providing(k.clone()) {
                Ok(_) => {
                    self.announced.insert(name, k);
                    out.started += 1;
                }
                Err(e) => {
                    out.failed += 1;
                    last_error = Some(e);
                }
            }
        }
        self.unannounced = out.failed;
        if let Some(e) = last_error {
            tracing::warn!(
                error = %e,
                unannounced = out.failed,
                announced = self.announced.len(),
                "cannot provide service keys; retrying later"
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use agentmesh_proto::pb::mesh::{ServiceRecord, SignedRecord};
    use libp2p::kad::store::{MemoryStoreConfig, RecordStore};
    use libp2p::{PeerId, StreamProtocol};

    use super::*;

    /// A real Kademlia behaviour whose store holds `max_keys` distinct keys.
    fn kad(max_keys: usize) -> kad::Behaviour<MemoryStore> {
        let me = PeerId::random();
        let store = MemoryStore::with_config(
            me,
            MemoryStoreConfig {
                max_provided_keys: max_keys,
                ..Default::default()
            },
        );
        kad::Behaviour::with_config(
            me,
            store,
            kad::Config::new(StreamProtocol::new(crate::protocols::KAD_PROTOCOL)),
        )
    }

    fn publish(c: &mut CatalogStore, peer: PeerId, services: &[&str]) {
        let r = ServiceRecord {
            provider: peer.to_bytes(),
            services: services.iter().map(|s| s.to_string()).collect(),
            routers: vec![],
            issued_at_unix_secs: 0,
            expires_at_unix_secs: 100,
            credential: None,
        };
        let s = SignedRecord {
            record: peer.to_bytes(),
            signature: vec![],
        };
        c.publish(peer, s, &r, 0).expect("stored");
    }

    fn provided(k: &mut kad::Behaviour<MemoryStore>, name: &str) -> bool {
        let key = service_key(name);
        k.store_mut().provided().any(|p| p.key == key)
    }

    #[test]
    fn a_refused_key_is_retried_until_it_is_announced() {
        let mut catalog = CatalogStore::new(10);
        let mut kad = kad(1);
        let mut p = Provided::default();
        let (a, b) = (PeerId::random(), PeerId::random());
        publish(&mut catalog, a, &["first"]);
        assert_eq!(p.reconcile(&catalog, false, &mut kad).started, 1);
        publish(&mut catalog, b, &["second"]);
        // The store holds one key: "second" is refused and stays pending.
        let out = p.reconcile(&catalog, false, &mut kad);
        assert_eq!((out.started, out.failed), (0, 1));
        assert!(p.has_unannounced());
        assert_eq!(
            p.reconcile(&catalog, false, &mut kad).failed,
            1,
            "tried again, not marked provided"
        );
        // "first" goes: its slot frees and "second" is announced.
        catalog.remove(&a);
        let out = p.reconcile(&catalog, false, &mut kad);
        assert_eq!((out.stopped, out.started, out.failed), (1, 1, 0));
        assert!(provided(&mut kad, "second") && !provided(&mut kad, "first"));
        assert!(!p.has_unannounced());
        assert_eq!(p.announced.len(), 1);
    }

    #[test]
    fn keys_are_hashed_once_per_name_and_only_changes_touch_the_dht() {
        let mut catalog = CatalogStore::new(10);
        let mut kad = kad(100);
        let mut p = Provided::default();
        let hashed = Cell::new(0);
        let key_of = |n: &str| {
            hashed.set(hashed.get() + 1);
            service_key(n)
        };
        let (a, b) = (PeerId::random(), PeerId::random());
        publish(&mut catalog, a, &["x", "y"]);
        publish(&mut catalog, b, &["y", "z"]);
        let out = p.reconcile_with(&catalog, false, &mut kad, key_of);
        assert_eq!((out.started, hashed.get()), (3, 3));
        // Nothing changed: nothing hashed, nothing announced.
        let out = p.reconcile_with(&catalog, false, &mut kad, key_of);
        assert_eq!((out, hashed.get()), (Outcome::default(), 3));
        // b leaves: only z goes (y is still a's).
        catalog.remove(&b);
        let out = p.reconcile_with(&catalog, false, &mut kad, key_of);
        assert_eq!((out.stopped, out.started, hashed.get()), (1, 0, 3));
        assert!(provided(&mut kad, "y") && !provided(&mut kad, "z"));
        // A router joined: every name is announced again, none re-hashed.
        let out = p.reconcile_with(&catalog, true, &mut kad, key_of);
        assert_eq!((out.started, hashed.get()), (2, 3));
    }
}
