//! The router's own addresses: those its listeners are bound to and those it
//! announces (external addresses, which members dial and the lease carries).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use libp2p::core::transport::ListenerId;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, Swarm};
use parking_lot::RwLock;

/// How long start-up waits for every listener to report its address.
pub(crate) const LISTEN_DEADLINE: Duration = Duration::from_secs(10);

/// The configured address of each listener (to derive external addresses).
pub(crate) type Listeners = HashMap<ListenerId, Multiaddr>;

/// A listen address that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("listening on {addr}: {reason}")]
pub(crate) struct BindError {
    /// The address (empty when no one listener is to blame).
    pub(crate) addr: Multiaddr,
    /// What failed.
    pub(crate) reason: String,
}

/// Bound and announced addresses, written by start-up and the swarm loop.
#[derive(Debug, Default)]
pub(crate) struct Addrs {
    /// Bound listen addresses, with real ports.
    pub(crate) listen: RwLock<Vec<Multiaddr>>,
    /// Addresses announced to members.
    pub(crate) external: RwLock<Vec<Multiaddr>>,
}

/// The external address for `bound` when the listener was configured as
/// `configured`: the bound address if the configured IP is specific (e.g.
/// loopback), else none (0.0.0.0 needs `--external-addr`).
pub(crate) fn derive_external(configured: &Multiaddr, bound: &Multiaddr) -> Option<Multiaddr> {
    let specific = configured.iter().any(|p| match p {
        Protocol::Ip4(ip) => !ip.is_unspecified(),
        Protocol::Ip6(ip) => !ip.is_unspecified(),
        Protocol::Dns(_) | Protocol::Dns4(_) | Protocol::Dns6(_) => true,
        _ => false,
    });
    specific.then(|| bound.clone())
}

/// Binds `listen` on `swarm` and waits (within [`LISTEN_DEADLINE`]) for
/// each listener's first address, recording it in `addrs` (and, with no
/// `external` given, the external address a specific listen address
/// implies); then announces `external`. Runs before any task starts, so
/// start-up is the one writer until the swarm loop takes over.
pub(crate) async fn bind<B: NetworkBehaviour>(
    swarm: &mut Swarm<B>,
    listen: &[Multiaddr],
    external: &[Multiaddr],
    addrs: &Addrs,
) -> Result<Listeners, BindError> {
    let mut listeners = HashMap::new();
    for addr in listen {
        let id = swarm.listen_on(addr.clone()).map_err(|e| BindError {
            addr: addr.clone(),
            reason: e.to_string(),
        })?;
        listeners.insert(id, addr.clone());
    }
    let configured = |id: &ListenerId| listeners.get(id).cloned().unwrap_or_else(Multiaddr::empty);
    let mut pending: HashSet<_> = listeners.keys().copied().collect();
    let deadline = tokio::time::Instant::now() + LISTEN_DEADLINE;
    while !pending.is_empty() {
        let ev = tokio::time::timeout_at(deadline, swarm.select_next_some())
            .await
            .map_err(|_| BindError {
                addr: Multiaddr::empty(),
                reason: "no listen address within 10 s".into(),
            })?;
        match ev {
            SwarmEvent::NewListenAddr {
                listener_id,
                address,
            } => {
                pending.remove(&listener_id);
                addrs.listen.write().push(address.clone());
                if external.is_empty()
                    && let Some(ext) = listeners
                        .get(&listener_id)
                        .and_then(|l| derive_external(l, &address))
                {
                    swarm.add_external_address(ext.clone());
                    addrs.external.write().push(ext);
                }
            }
            SwarmEvent::ListenerClosed {
                listener_id,
                reason,
                ..
            } => {
                return Err(BindError {
                    addr: configured(&listener_id),
                    reason: format!("listener closed: {reason:?}"),
                });
            }
            SwarmEvent::ListenerError { listener_id, error } => {
                return Err(BindError {
                    addr: configured(&listener_id),
                    reason: error.to_string(),
                });
            }
            _ => {}
        }
    }
    for ext in external {
        swarm.add_external_address(ext.clone());
        addrs.external.write().push(ext.clone());
    }
    Ok(listeners)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_specific_listen_address_is_announced_as_is() {
        let bound: Multiaddr = "/ip4/127.0.0.1/tcp/4001".parse().expect("addr");
        let loopback: Multiaddr = "/ip4/127.0.0.1/tcp/0".parse().expect("addr");
        let any: Multiaddr = "/ip4/0.0.0.0/tcp/0".parse().expect("addr");
        assert_eq!(derive_external(&loopback, &bound), Some(bound.clone()));
        assert_eq!(derive_external(&any, &bound), None);
    }
}
