//! The catalog's metrics: records held, requests by op and result,
//! provider searches and DHT announcements refused.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::{CATALOG_OPS, CATALOG_RESULTS, L1, L2, UNKNOWN_OP};

/// The catalog's metrics.
#[derive(Debug, Clone, Default)]
pub(crate) struct CatalogMetrics {
    pub(crate) records: Gauge,
    pub(crate) requests: Family<L2, Counter>,
    pub(crate) provider_searches: Family<L1, Counter>,
    pub(crate) provide_failures: Counter,
}

impl CatalogMetrics {
    /// Registers them in `r`, every op and result at 0 (provider-search
    /// outcomes: `crate::catalog`).
    pub(crate) fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        r.register(
            "agentmesh_router_catalog_records",
            "Service records held for attached members",
            m.records.clone(),
        );
        r.register(
            "agentmesh_router_catalog_requests",
            "Catalog requests by op and result",
            m.requests.clone(),
        );
        r.register(
            "agentmesh_router_catalog_provider_searches",
            "Requests for a service's provider routers by outcome: started a DHT query, \
             joined the one running for that service, or answered from a recent one \
             (--catalog-provider-cache-ms)",
            m.provider_searches.clone(),
        );
        r.register(
            "agentmesh_router_catalog_provide_failures",
            "Service keys the router DHT refused to announce (its store of distinct keys, \
             other routers' included, was full); each is retried on the next catalog \
             change and periodically",
            m.provide_failures.clone(),
        );
        for op in CATALOG_OPS {
            for res in CATALOG_RESULTS {
                let _ = m.requests.get_or_create(&[("op", op), ("result", res)]);
            }
        }
        let _ = m
            .requests
            .get_or_create(&[("op", UNKNOWN_OP), ("result", "malformed")]);
        m
    }
}
