//! Where a local mesh's programs run: by default all here, on free
//! loopback ports; with `--hosts` ([`crate::hosts`]) the control plane,
//! each router and each fleet worker on a host of its own, each listening
//! on fixed ports of its host's own address.
//!
//! This module only describes places (a command prefix that starts a
//! program there, and the address it listens on), so the mesh and the
//! fleet can use one without knowing how it was made.

use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};

use serde::Serialize;

/// The control plane's gRPC port on a host of its own.
pub const CONTROL_PLANE_GRPC_PORT: u16 = 7400;
/// The control plane's HTTP port (`/readyz`, `/metrics`) on a host of its own.
pub const CONTROL_PLANE_HTTP_PORT: u16 = 7401;
/// A router's libp2p TCP port on a host of its own.
pub const ROUTER_PORT: u16 = 4001;
/// A router's `/metrics` and `/readyz` port on a host of its own.
pub const ROUTER_METRICS_PORT: u16 = 9100;

/// One place programs run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spot {
    /// The host's name (for reports and errors).
    pub host: String,
    /// The host's own address: what its programs listen on.
    pub addr: IpAddr,
    /// The command line that starts a program there, without the program
    /// (e.g. `ip netns exec NAMESPACE`).
    pub prefix: Vec<OsString>,
}

impl Spot {
    /// `port` on this host's address.
    pub fn at(&self, port: u16) -> SocketAddr {
        SocketAddr::new(self.addr, port)
    }
}

/// Where every program of a local run goes.
#[derive(Debug, Clone)]
pub struct Placement {
    /// The control plane's host.
    pub control_plane: Spot,
    /// Router `i` runs on `routers[i % len]`.
    pub routers: Vec<Spot>,
    /// Fleet worker `i` runs on `workers[i % len]`.
    pub workers: Vec<Spot>,
    /// What the report says about the hosts.
    pub record: HostsRecord,
}

impl Placement {
    /// Router `i`'s host.
    pub fn router(&self, i: usize) -> &Spot {
        &self.routers[i % self.routers.len().max(1)]
    }

    /// Fleet worker `i`'s host.
    pub fn worker(&self, i: usize) -> &Spot {
        &self.workers[i % self.workers.len().max(1)]
    }
}

/// The hosts of a `--hosts` run, as the report records them.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HostsRecord {
    /// Hosts asked for (`--hosts`): the control plane's, the routers', the members'.
    pub hosts: usize,
    /// `none`, `eim` or `symmetric` (`--member-nat`).
    pub member_nat: String,
    /// The testbed's name prefix (every namespace and link carries it).
    pub prefix: String,
    /// The control plane's host and address.
    pub control_plane: HostRecord,
    /// Each router's host and address.
    pub routers: Vec<HostRecord>,
    /// Each member host, with the address the internet sees it from.
    pub members: Vec<HostRecord>,
}

/// One host in the report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HostRecord {
    /// Its name.
    pub name: String,
    /// Its own address.
    pub addr: String,
    /// The address others see it from (its NAT gateway's, behind one).
    pub public_addr: String,
}

impl HostsRecord {
    /// One line for the markdown report.
    pub fn summary(&self) -> String {
        let publics: Vec<&str> = self
            .members
            .iter()
            .map(|m| m.public_addr.as_str())
            .collect();
        format!(
            "Hosts: {} (testbed {}): control plane on {}, {} router hosts, {} member hosts \
             (NAT: {}; seen from {})",
            self.hosts,
            self.prefix,
            self.control_plane.addr,
            self.routers.len(),
            self.members.len(),
            self.member_nat,
            publics.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spot(n: u8) -> Spot {
        Spot {
            host: format!("h{n}"),
            addr: IpAddr::from([10, 0, 0, n]),
            prefix: vec![
                "ip".into(),
                "netns".into(),
                "exec".into(),
                format!("h{n}").into(),
            ],
        }
    }

    #[test]
    fn programs_cycle_over_their_hosts() {
        let p = Placement {
            control_plane: spot(2),
            routers: vec![spot(3), spot(4)],
            workers: vec![spot(5), spot(6), spot(7)],
            record: HostsRecord::default(),
        };
        assert_eq!(p.router(0).host, "h3");
        assert_eq!(p.router(3).host, "h4");
        assert_eq!(p.worker(4).host, "h6");
        assert_eq!(
            p.control_plane.at(CONTROL_PLANE_GRPC_PORT).to_string(),
            "10.0.0.2:7400"
        );
    }
}
