//! The hosts of a `--hosts` run, made on a fresh testbed: the control
//! plane's, one per router, the members' (each behind a NAT of its own when
//! asked) and the coordinator's own (`ladder`), and the [`Placement`] that
//! puts each program on its host.

use agentmesh_netns::Host;

use super::MemberNat;
use super::driver::{Driver, testbed_error};
use crate::error::Result;
use crate::placement::{HostRecord, HostsRecord, Placement, Spot};

/// The coordinator's host name.
pub const DRIVER_HOST: &str = "ladder";
/// The control plane's host name.
pub const CONTROL_PLANE_HOST: &str = "cp";

/// What to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Hosts in all (`--hosts`).
    pub hosts: usize,
    /// Routers (one host each).
    pub routers: usize,
    /// Member hosts (the rest).
    pub member_hosts: usize,
    /// NAT in front of each member host.
    pub member_nat: MemberNat,
}

/// A built testbed: the coordinator's runtime, where each program goes,
/// and the namespaces (removed, with every process in them, when dropped;
/// the fields drop in order, the testbed last).
pub struct HostsTestbed {
    /// Runs the coordinator inside its own host.
    pub driver: Driver,
    /// Where each program goes.
    pub placement: Placement,
    /// The member hosts (tests start programs there).
    pub members: Vec<Host>,
    /// The member hosts' NAT gateways, in member host order (none without
    /// `--member-nat`).
    pub gateways: Vec<Host>,
    /// The router hosts, in router order.
    pub routers: Vec<Host>,
    /// The control plane's host.
    pub control_plane: Host,
    testbed: agentmesh_netns::Testbed,
}

impl HostsTestbed {
    /// The testbed itself (more hosts, links).
    pub fn testbed(&self) -> &agentmesh_netns::Testbed {
        &self.testbed
    }
}

fn spot(h: &Host) -> Spot {
    Spot {
        host: h.name().to_string(),
        addr: h.addr().into(),
        prefix: h.exec_prefix(),
    }
}

fn record(h: &Host) -> HostRecord {
    HostRecord {
        name: h.name().to_string(),
        addr: h.addr().to_string(),
        public_addr: h.public_addr().to_string(),
    }
}

impl Layout {
    /// Sweeps leftovers of killed runs, then makes every host.
    pub async fn build(&self) -> Result<HostsTestbed> {
        let tb = agentmesh_netns::Testbed::new()
            .await
            .map_err(testbed_error)?;
        let cp = tb
            .public_host(CONTROL_PLANE_HOST)
            .await
            .map_err(testbed_error)?;
        let mut routers = Vec::with_capacity(self.routers);
        for i in 0..self.routers {
            routers.push(
                tb.public_host(&format!("r{i}"))
                    .await
                    .map_err(testbed_error)?,
            );
        }
        let mut members = Vec::with_capacity(self.member_hosts);
        let mut gateways = Vec::new();
        for i in 0..self.member_hosts {
            let name = format!("m{i}");
            let host = match self.member_nat.kind() {
                None => tb.public_host(&name).await,
                Some(kind) => {
                    let nat = tb
                        .nat(&format!("{name}-gw"), kind)
                        .await
                        .map_err(testbed_error)?;
                    gateways.push(nat.gateway().clone());
                    tb.host_behind(&nat, &name).await
                }
            };
            members.push(host.map_err(testbed_error)?);
        }
        let driver_host = tb.public_host(DRIVER_HOST).await.map_err(testbed_error)?;
        let placement = Placement {
            control_plane: spot(&cp),
            routers: routers.iter().map(spot).collect(),
            workers: members.iter().map(spot).collect(),
            record: HostsRecord {
                hosts: self.hosts,
                member_nat: self.member_nat.as_str().to_string(),
                prefix: tb.prefix().to_string(),
                control_plane: record(&cp),
                routers: routers.iter().map(record).collect(),
                members: members.iter().map(record).collect(),
            },
        };
        Ok(HostsTestbed {
            driver: Driver::new(driver_host)?,
            placement,
            members,
            gateways,
            routers,
            control_plane: cp,
            testbed: tb,
        })
    }
}
