//! `agentmesh-ladder local --hosts N`: the ladder the way it runs on real
//! machines. The control plane, each router and each fleet worker run on a
//! host of their own, built from network namespaces by `agentmesh-netns`
//! (one stack each: own loopback, own address, own ports), members behind
//! NAT gateways when asked (`--member-nat`). Everything else is the ladder
//! of today: the same steps, hold, events and reports; kills and drains
//! signal the router processes, which now run in their hosts.
//!
//! Layout ([`build`]): one public host for the control plane, one per
//! router, and the rest of the N for members; fleet workers are spread over
//! the member hosts in turn. A further public host, `ladder`, holds the
//! coordinator's own sockets ([`driver`]): from there it reaches every
//! program's `/readyz` and `/metrics` as an operator's machine would.
//!
//! Cleanup: the testbed removes its namespaces, and every process in them,
//! when the run ends, fails, panics or is interrupted; a run killed outright
//! leaves them for the next run's sweep (see `agentmesh-netns`).
//!
//! `agentmesh-ladder testbed` ([`testbed`]) builds the same hosts and mesh
//! without a fleet and keeps them up, describing them in `testbed.json`
//! ([`testbed_file`]) for `agentmesh-ladder remote` runs on a member host.

pub mod build;
pub mod driver;
pub mod testbed;
pub mod testbed_file;

use crate::config::{FleetConfig, LocalConfig};
use crate::error::{LadderError, Result};
use crate::report::Report;

/// Most hosts a run may ask for: every member host may sit behind a NAT of
/// its own, and the testbed has 254 NAT LANs.
pub const MAX_HOSTS: usize = 250;

/// Whether member hosts sit behind NAT gateways, and which kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MemberNat {
    /// Member hosts on the internet with public addresses.
    #[default]
    None,
    /// Each member host behind a NAT of its own with endpoint-independent
    /// mapping (plain masquerade, as home routers do).
    Eim,
    /// Each member host behind a NAT of its own with endpoint-dependent
    /// mapping (random ports per flow, as carrier-grade NATs do).
    Symmetric,
}

impl MemberNat {
    /// The testbed's kind of NAT, if any.
    pub fn kind(self) -> Option<agentmesh_netns::NatKind> {
        match self {
            Self::None => None,
            Self::Eim => Some(agentmesh_netns::NatKind::EndpointIndependent),
            Self::Symmetric => Some(agentmesh_netns::NatKind::EndpointDependent),
        }
    }

    /// `none`, `eim` or `symmetric`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Eim => "eim",
            Self::Symmetric => "symmetric",
        }
    }
}

/// The `--hosts` flags of local mode.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct HostsConfig {
    /// Run the control plane, each router and each fleet worker on hosts of
    /// their own (network namespaces; needs root): this many hosts in all,
    /// one for the control plane, one per router (`--routers`), the rest
    /// for members (workers spread over them in turn). At most 250.
    /// Default: everything on this machine's loopback.
    #[arg(long = "hosts")]
    pub hosts: Option<usize>,
    /// With `--hosts`: put each member host behind a NAT gateway of its own
    /// (`eim`: endpoint-independent mapping; `symmetric`: endpoint-dependent,
    /// random ports), or none.
    #[arg(long = "member-nat", value_enum, default_value_t = MemberNat::None)]
    pub member_nat: MemberNat,
}

impl HostsConfig {
    /// Member hosts of a run with `routers` routers, or why the flags do
    /// not make a hosts run (`Ok(None)`: not a hosts run).
    pub fn member_hosts(&self, routers: usize) -> Result<Option<usize>> {
        let Some(n) = self.hosts else {
            if self.member_nat != MemberNat::None {
                return Err(LadderError::Args(
                    "--member-nat needs --hosts (members on hosts of their own)".into(),
                ));
            }
            return Ok(None);
        };
        if n > MAX_HOSTS {
            return Err(LadderError::Args(format!(
                "--hosts {n}: at most {MAX_HOSTS}"
            )));
        }
        let mesh = 1 + routers;
        if n <= mesh {
            return Err(LadderError::Args(format!(
                "--hosts {n}: the control plane and {routers} routers take {mesh} hosts, \
                 so at least {} are needed (one or more for members)",
                mesh + 1
            )));
        }
        Ok(Some(n - mesh))
    }
}

/// Refuses what a hosts run cannot do: members dialing from 127.0.0.x
/// (each host has its own addresses), hostile peers (they dial from
/// 127.0.0.x too) and a database the control plane's host cannot reach.
fn check(local: &LocalConfig, fleet: &FleetConfig) -> Result<()> {
    if fleet.source_ips.is_some_and(|n| n > 0) {
        return Err(LadderError::Args(
            "--source-ips with --hosts: members dial from their own hosts' addresses".into(),
        ));
    }
    if fleet.attack.starts_at().is_some() {
        return Err(LadderError::Args(
            "--attack-* with --hosts: the hostile peers dial from 127.0.0.x of this machine".into(),
        ));
    }
    if local.control_planes > 1 {
        return Err(LadderError::Args(
            "--control-planes with --hosts: the control plane has one host of its own \
             (and replicas need PostgreSQL, which --hosts cannot reach)"
                .into(),
        ));
    }
    if local.control_plane_store != crate::postgres::StoreKind::Sqlite {
        return Err(LadderError::Args(
            "--control-plane-store postgres with --hosts: the server would listen on this \
             machine's loopback, which the control plane's host cannot reach"
                .into(),
        ));
    }
    if local.control_plane_db.is_some() {
        return Err(LadderError::Args(
            "--control-plane-db with --hosts: the control plane's host reaches nothing \
             outside the testbed; it uses SQLite in the work dir"
                .into(),
        ));
    }
    Ok(())
}

/// Runs a local ladder: on hosts of their own with `--hosts`, else as
/// [`crate::run_local`] does.
pub async fn run_local(
    hosts: HostsConfig,
    local: LocalConfig,
    fleet: FleetConfig,
) -> Result<Report> {
    let Some(member_hosts) = hosts.member_hosts(local.routers)? else {
        return crate::run::run_local(local, fleet).await;
    };
    check(&local, &fleet)?;
    let fleet = FleetConfig {
        source_ips: Some(0),
        ..fleet
    };
    let testbed = build::Layout {
        hosts: hosts.hosts.unwrap_or_default(),
        routers: local.routers,
        member_hosts,
        member_nat: hosts.member_nat,
    }
    .build()
    .await?;
    eprintln!("ladder: {}", testbed.placement.record.summary());
    let place = testbed.placement.clone();
    let result = testbed
        .driver
        .run(crate::run::run_local_at(local, fleet, Some(place)))
        .await;
    // The testbed goes last: removing its namespaces kills what is left.
    drop(testbed);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_leave_room_for_members() {
        let h = |n, nat| HostsConfig {
            hosts: n,
            member_nat: nat,
        };
        assert_eq!(h(None, MemberNat::None).member_hosts(4).ok(), Some(None));
        assert_eq!(
            h(Some(4), MemberNat::Eim).member_hosts(2).ok(),
            Some(Some(1))
        );
        assert_eq!(
            h(Some(6), MemberNat::Eim).member_hosts(2).ok(),
            Some(Some(3))
        );
        let e = h(Some(3), MemberNat::None)
            .member_hosts(2)
            .expect_err("too few");
        assert!(e.to_string().contains("at least 4"), "{e}");
        let e = h(None, MemberNat::Eim)
            .member_hosts(2)
            .expect_err("nat alone");
        assert!(e.to_string().contains("--member-nat needs --hosts"), "{e}");
        let e = h(Some(MAX_HOSTS + 1), MemberNat::None)
            .member_hosts(2)
            .expect_err("too many");
        assert!(e.to_string().contains("at most"), "{e}");
    }

    #[test]
    fn a_hosts_run_refuses_loopback_tricks() {
        let local = LocalConfig::default();
        let mut fleet = FleetConfig::default();
        assert!(check(&local, &fleet).is_ok());
        fleet.source_ips = Some(0);
        assert!(check(&local, &fleet).is_ok());
        fleet.source_ips = Some(16);
        let e = check(&local, &fleet).expect_err("source ips");
        assert!(e.to_string().contains("--source-ips"), "{e}");
        let local = LocalConfig {
            control_plane_db: Some("postgres://x@127.0.0.1/db".into()),
            ..LocalConfig::default()
        };
        let e = check(&local, &FleetConfig::default()).expect_err("db");
        assert!(e.to_string().contains("--control-plane-db"), "{e}");
        let local = LocalConfig {
            control_plane_store: crate::postgres::StoreKind::Postgres,
            ..LocalConfig::default()
        };
        let e = check(&local, &FleetConfig::default()).expect_err("store");
        assert!(e.to_string().contains("--control-plane-store"), "{e}");
    }
}
