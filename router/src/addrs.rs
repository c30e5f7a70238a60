//! The router's own addresses: those its listeners are bound to and those it
//! announces (external addresses, which members dial and the lease carries).

use libp2p::Multiaddr;
use libp2p::multiaddr::Protocol;
use parking_lot::RwLock;

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
