//! The control-plane link's metrics: leases, directory fetches and key
//! fetches by result.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{CP_RESULTS, L1};

/// The control-plane link's metrics.
#[derive(Debug, Clone, Default)]
pub(crate) struct CpMetrics {
    pub(crate) lease: Family<L1, Counter>,
    pub(crate) directory_sync: Family<L1, Counter>,
    pub(crate) key_fetch: Family<L1, Counter>,
}

impl CpMetrics {
    /// Registers them in `r`, every result at 0.
    pub(crate) fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        r.register(
            "agentmesh_router_lease",
            "Router leases by result",
            m.lease.clone(),
        );
        r.register(
            "agentmesh_router_directory_sync",
            "Directory fetches by result",
            m.directory_sync.clone(),
        );
        r.register(
            "agentmesh_router_key_fetch",
            "Key-set fetches by result",
            m.key_fetch.clone(),
        );
        for res in CP_RESULTS {
            let _ = m.lease.get_or_create(&[("result", res)]);
            let _ = m.directory_sync.get_or_create(&[("result", res)]);
            let _ = m.key_fetch.get_or_create(&[("result", res)]);
        }
        m
    }
}
