//! The attack's flags (`--attack-*`), one clap flag per field, defaults
//! defined once, and the checks that keep the attackers' addresses apart
//! from the members'.

use std::net::Ipv4Addr;

use crate::error::{LadderError, Result};

/// Default length of each attack, seconds.
pub const DEFAULT_DURATION_SECS: u64 = 60;
/// Default source addresses attacking the router (one harness process each).
pub const DEFAULT_ROUTER_SOURCES: u8 = 2;
/// Default connections each router-attack source holds (the router's
/// `--unauthenticated-connections-per-ip`).
pub const DEFAULT_ROUTER_PEERS: usize = 64;
/// Default auth streams per attacking connection.
pub const DEFAULT_ROUTER_STREAMS_PER_PEER: usize = 4;
/// Default rate of the control-plane flood, requests per second.
pub const DEFAULT_CONTROL_PLANE_RATE_PER_SEC: u32 = 1_000;
/// Default bound of the flood's requests in flight.
pub const DEFAULT_CONTROL_PLANE_MAX_IN_FLIGHT: usize = 256;
/// Default request kinds of the flood: every unauthenticated RPC.
pub const DEFAULT_CONTROL_PLANE_KINDS: &str =
    "empty-refresh,garbage-refresh,empty-lease,bad-enroll,get-keys,get-directory";
/// Default members joining while the attack runs.
pub const DEFAULT_JOINERS: u64 = 100;
/// Default first address the attackers dial from: far above the members'
/// 127.0.0.10 onwards.
pub const DEFAULT_FIRST_SOURCE_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 200);

/// Hostile peers during the hold (local mode): the `agentmesh-hostile`
/// harness against one router and against the control plane, from
/// addresses the members do not use, bounded in count and duration.
#[derive(Debug, Clone, PartialEq, clap::Args)]
#[command(next_help_heading = "Attack (local mode, during the hold)")]
pub struct AttackConfig {
    /// Start the router-auth attack on the busiest router this many seconds into the hold, seconds (default: none).
    #[arg(long = "attack-router-at")]
    pub router_at_secs: Option<u64>,
    /// Start the control-plane flood this many seconds into the hold, seconds (default: none).
    #[arg(long = "attack-control-plane-at")]
    pub control_plane_at_secs: Option<u64>,
    /// How long each attack runs, seconds (cut at the end of its window). Default 60.
    #[arg(long = "attack-duration-secs", default_value_t = DEFAULT_DURATION_SECS)]
    pub duration_secs: u64,
    /// Source addresses attacking the router, one harness process each, sources (even ones stall with a length byte, odd ones silent). Default 2.
    #[arg(long = "attack-router-sources", default_value_t = DEFAULT_ROUTER_SOURCES,
          value_parser = clap::value_parser!(u8).range(1..=32))]
    pub router_sources: u8,
    /// Connections each router-attack source holds at once, each a fresh PeerId, connections. Default 64.
    #[arg(long = "attack-router-peers", default_value_t = DEFAULT_ROUTER_PEERS)]
    pub router_peers: usize,
    /// Stalling auth streams each attacking connection holds, streams. Default 4.
    #[arg(long = "attack-router-streams-per-peer", default_value_t = DEFAULT_ROUTER_STREAMS_PER_PEER)]
    pub router_streams_per_peer: usize,
    /// Rate of the control-plane flood, requests per second. Default 1000.
    #[arg(long = "attack-control-plane-rate-per-sec", default_value_t = DEFAULT_CONTROL_PLANE_RATE_PER_SEC)]
    pub control_plane_rate_per_sec: u32,
    /// Flood requests in flight at most (more are skipped), requests. Default 256.
    #[arg(long = "attack-control-plane-max-in-flight", default_value_t = DEFAULT_CONTROL_PLANE_MAX_IN_FLIGHT)]
    pub control_plane_max_in_flight: usize,
    /// Flood request kinds, comma-separated (see `agentmesh-hostile control-plane-flood --help`). Default: all six.
    #[arg(long = "attack-control-plane-kinds", default_value = DEFAULT_CONTROL_PLANE_KINDS)]
    pub control_plane_kinds: String,
    /// Members joining while the attack runs (their enroll and ready times are the attacked ones), members. Default 100.
    #[arg(long = "attack-joiners", default_value_t = DEFAULT_JOINERS)]
    pub joiners: u64,
    /// First loopback address the attackers dial from: the router's sources from it on, the flood from the next one after them. Default 127.0.0.200.
    #[arg(long = "attack-first-source-ip", default_value_t = DEFAULT_FIRST_SOURCE_IP)]
    pub first_source_ip: Ipv4Addr,
}

impl Default for AttackConfig {
    fn default() -> Self {
        Self {
            router_at_secs: None,
            control_plane_at_secs: None,
            duration_secs: DEFAULT_DURATION_SECS,
            router_sources: DEFAULT_ROUTER_SOURCES,
            router_peers: DEFAULT_ROUTER_PEERS,
            router_streams_per_peer: DEFAULT_ROUTER_STREAMS_PER_PEER,
            control_plane_rate_per_sec: DEFAULT_CONTROL_PLANE_RATE_PER_SEC,
            control_plane_max_in_flight: DEFAULT_CONTROL_PLANE_MAX_IN_FLIGHT,
            control_plane_kinds: DEFAULT_CONTROL_PLANE_KINDS.to_string(),
            joiners: DEFAULT_JOINERS,
            first_source_ip: DEFAULT_FIRST_SOURCE_IP,
        }
    }
}

impl AttackConfig {
    /// Whether any attack is asked for.
    pub fn enabled(&self) -> bool {
        self.router_at_secs.is_some() || self.control_plane_at_secs.is_some()
    }

    /// When the attack's window starts: the earlier of the two, seconds into the hold.
    pub fn starts_at(&self) -> Option<u64> {
        match (self.router_at_secs, self.control_plane_at_secs) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Members the attack adds to the run (token uses).
    pub fn members(&self) -> u64 {
        if self.enabled() { self.joiners } else { 0 }
    }

    /// The address router-attack source `i` dials from.
    pub fn router_source(&self, i: u8) -> Ipv4Addr {
        offset(self.first_source_ip, i)
    }

    /// The address the control-plane flood comes from (after the router's).
    pub fn control_plane_source(&self) -> Ipv4Addr {
        offset(self.first_source_ip, self.router_sources)
    }

    /// Refuses attacker addresses the members use (`member_source_ips`
    /// from `member_first`, or 127.0.0.1 when there are none and the kernel
    /// chooses) or that leave 127.0.0.0/24.
    pub fn check(&self, member_first: Ipv4Addr, member_source_ips: u8) -> Result<()> {
        if !self.enabled() {
            return Ok(());
        }
        let [a, b, c, first] = self.first_source_ip.octets();
        let last = u16::from(first) + u16::from(self.router_sources);
        if [a, b, c] != [127, 0, 0] || first == 0 || last > 254 {
            return Err(LadderError::Args(format!(
                "--attack-first-source-ip {}: the attackers' {} addresses must lie in 127.0.0.1-254",
                self.first_source_ip,
                u16::from(self.router_sources) + 1
            )));
        }
        let members = if member_source_ips == 0 {
            1..=1
        } else {
            let lo = u16::from(member_first.octets()[3]);
            lo..=(lo + u16::from(member_source_ips) - 1).min(255)
        };
        let attackers = u16::from(first)..=last;
        if attackers.start() <= members.end() && members.start() <= attackers.end() {
            return Err(LadderError::Args(format!(
                "the attackers' addresses 127.0.0.{}-{} overlap the members' 127.0.0.{}-{}: \
                 move --attack-first-source-ip or lower --source-ips",
                attackers.start(),
                attackers.end(),
                members.start(),
                members.end()
            )));
        }
        Ok(())
    }
}

fn offset(ip: Ipv4Addr, by: u8) -> Ipv4Addr {
    let [a, b, c, d] = ip.octets();
    Ipv4Addr::new(a, b, c, d.saturating_add(by))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(router: Option<u64>, cp: Option<u64>) -> AttackConfig {
        AttackConfig {
            router_at_secs: router,
            control_plane_at_secs: cp,
            ..AttackConfig::default()
        }
    }

    #[test]
    fn the_window_starts_with_the_first_attack() {
        assert_eq!(on(None, None).starts_at(), None);
        assert_eq!(on(Some(20), None).starts_at(), Some(20));
        assert_eq!(on(Some(20), Some(5)).starts_at(), Some(5));
        assert_eq!(on(None, None).members(), 0);
        assert_eq!(on(None, Some(1)).members(), DEFAULT_JOINERS);
    }

    const MEMBERS: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 10);

    #[test]
    fn attackers_keep_off_the_members_addresses() {
        let a = on(Some(1), Some(1));
        assert_eq!(a.router_source(0), Ipv4Addr::new(127, 0, 0, 200));
        assert_eq!(a.router_source(1), Ipv4Addr::new(127, 0, 0, 201));
        assert_eq!(a.control_plane_source(), Ipv4Addr::new(127, 0, 0, 202));
        assert!(a.check(MEMBERS, 16).is_ok());
        assert!(a.check(MEMBERS, 0).is_ok());
        // Members on 127.0.0.10-209 would include the attackers.
        let err = a.check(MEMBERS, 200).expect_err("overlap");
        assert!(err.to_string().contains("overlap"), "{err}");
        let low = AttackConfig {
            first_source_ip: Ipv4Addr::new(127, 0, 0, 1),
            ..a.clone()
        };
        assert!(
            low.check(MEMBERS, 0).is_err(),
            "127.0.0.1 is the kernel's choice"
        );
        assert!(
            low.check(MEMBERS, 16).is_ok(),
            "members start at 127.0.0.10"
        );
        let elsewhere = AttackConfig {
            first_source_ip: Ipv4Addr::new(10, 0, 0, 1),
            ..a.clone()
        };
        assert!(elsewhere.check(MEMBERS, 16).is_err());
        // Nothing to check without an attack.
        assert!(AttackConfig::default().check(MEMBERS, 255).is_ok());
    }
}
