//! Inbound direct connections still in their handshake (noise, yamux),
//! bounded in total and per source IP: a stranger can reach the listening
//! port before anything says who it is, and each handshake costs memory
//! and CPU. Over either bound the connection is refused at accept,
//! counted in `agentmesh_node_inbound_refused_total{reason}`
//! (`pending_full`, `source_pending_full`).

use std::collections::HashMap;
use std::net::IpAddr;

use libp2p::swarm::ConnectionId;

/// Handshakes in progress on the listening port.
#[derive(Debug, Default)]
pub(crate) struct PendingInbound {
    max_total: usize,
    max_per_source: usize,
    by_id: HashMap<ConnectionId, IpAddr>,
    by_source: HashMap<IpAddr, usize>,
}

impl PendingInbound {
    /// At most `max_total` at once, `max_per_source` from one IP (0 acts as 1).
    pub(crate) fn new(max_total: usize, max_per_source: usize) -> Self {
        Self {
            max_total: max_total.max(1),
            max_per_source: max_per_source.max(1),
            ..Self::default()
        }
    }

    /// A connection from `ip` arrived: taken, or the reason it is refused.
    pub(crate) fn admit(&mut self, id: ConnectionId, ip: IpAddr) -> Result<(), &'static str> {
        if self.by_id.len() >= self.max_total {
            return Err("pending_full");
        }
        let held = self.by_source.entry(ip).or_insert(0);
        if *held >= self.max_per_source {
            return Err("source_pending_full");
        }
        *held += 1;
        self.by_id.insert(id, ip);
        Ok(())
    }

    /// Its handshake ended (established, refused or failed).
    pub(crate) fn release(&mut self, id: &ConnectionId) {
        let Some(ip) = self.by_id.remove(id) else {
            return;
        };
        if let Some(n) = self.by_source.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.by_source.remove(&ip);
            }
        }
    }

    /// Handshakes in progress.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshakes_are_bounded_in_total_and_per_source_and_released() {
        let mut p = PendingInbound::new(3, 2);
        let (a, b): (IpAddr, IpAddr) = (
            "10.0.0.5".parse().expect("ip"),
            "10.0.0.6".parse().expect("ip"),
        );
        let id = ConnectionId::new_unchecked;
        assert_eq!(p.admit(id(1), a), Ok(()));
        assert_eq!(p.admit(id(2), a), Ok(()));
        assert_eq!(p.admit(id(3), a), Err("source_pending_full"));
        assert_eq!(p.admit(id(4), b), Ok(()));
        assert_eq!(p.admit(id(5), b), Err("pending_full"));
        p.release(&id(1));
        p.release(&id(1));
        assert_eq!(p.len(), 2);
        assert_eq!(p.admit(id(6), a), Ok(()));
        for i in [2, 4, 6, 99] {
            p.release(&id(i));
        }
        assert_eq!(p.len(), 0);
        assert!(p.by_source.is_empty());
    }
}
