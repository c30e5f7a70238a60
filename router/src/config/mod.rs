//! The router's configuration: data only, one section per subsystem, each
//! field one command-line flag.
//!
//! Every default is defined once, as a named constant next to its section;
//! `crate::cli` maps the flat flags 1:1 onto these fields and a test checks
//! that no flags yields [`Config::default`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use libp2p::Multiaddr;

use crate::resources::budget::{Budgets, Watermarks};
use crate::resources::sizing::SizingFlags;
pub use crate::resources::sizing::{Sizing, high_watermark_for_budget};

mod connections;
mod control_plane;
mod members;
mod services;

pub use connections::*;
pub use control_plane::*;
pub use members::*;
pub use services::*;

/// Default key file.
pub const DEFAULT_KEY_PATH: &str = "router.key";
/// Default listen address.
pub const DEFAULT_LISTEN: &str = "/ip4/0.0.0.0/tcp/4001";
/// Default deadline of one command to the swarm loop's tables (queue and
/// answer), milliseconds: the loop answers in microseconds unless it is
/// stalled, and an auth stream's own timeout is longer.
pub const DEFAULT_STATE_COMMAND_DEADLINE_MS: u64 = 5_000;

/// Everything a router needs to start. Data only; see `spawn`. The
/// router's own identity and addresses are fields; everything a subsystem
/// reads is in that subsystem's section.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The control-plane link.
    pub control_plane: ControlPlaneConfig,
    /// Ed25519 identity key file, created (mode 0600) on first run. Default `router.key`.
    pub key_path: PathBuf,
    /// Multiaddrs to listen on (TCP). Default `/ip4/0.0.0.0/tcp/4001`.
    pub listen: Vec<Multiaddr>,
    /// Addresses members dial; required when listening on 0.0.0.0 or port 0 off
    /// loopback, otherwise derived from the bound address. Default none.
    pub external_addr: Vec<Multiaddr>,
    /// Labels announced in the directory (`k=v`; only labels the token allows). Default none.
    pub labels: BTreeMap<String, String>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served. Default none (off).
    pub metrics_addr: Option<SocketAddr>,
    /// Deadline of one command to the swarm loop (the tables' admit, keys,
    /// revocations, regroup, router set; trim's and drain's disconnects;
    /// queue and answer). Default 5 s.
    pub state_command_deadline: Duration,
    /// Admission: the auth deadline and the auth protocol's bounds.
    pub auth: AuthConfig,
    /// The members the router holds: watermarks and trimming.
    pub watermarks: WatermarkConfig,
    /// Drains and the go-aways drains and trims send.
    pub drain: DrainConfig,
    /// The policy's watch on the control plane and push to members.
    pub policy: PolicyConfig,
    /// The relay server's reservations and circuits.
    pub relay: RelayConfig,
    /// The catalog's records, streams and lookups.
    pub catalog: CatalogConfig,
    /// Idle and dead connections, stream deadlines and queues.
    pub connections: ConnectionConfig,
    /// Resource budgets and limits (see `resource_config`).
    pub resources: crate::resources::config::ResourceConfig,
    /// Run the runtime stall watchdog (`agentmesh_runtime_stalls_total` on
    /// /metrics) and show the allocator's bytes
    /// (`agentmesh_runtime_allocator_*`, jemalloc). One per process: the
    /// binary turns it on; programs that embed several routers run their
    /// own. Default off.
    pub runtime_watchdog: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            control_plane: ControlPlaneConfig::default(),
            key_path: PathBuf::from(DEFAULT_KEY_PATH),
            listen: vec![
                DEFAULT_LISTEN
                    .parse()
                    .expect("DEFAULT_LISTEN is a valid multiaddr"),
            ],
            external_addr: Vec::new(),
            labels: BTreeMap::new(),
            metrics_addr: None,
            state_command_deadline: Duration::from_millis(DEFAULT_STATE_COMMAND_DEADLINE_MS),
            auth: AuthConfig::default(),
            watermarks: WatermarkConfig::default(),
            drain: DrainConfig::default(),
            policy: PolicyConfig::default(),
            relay: RelayConfig::default(),
            catalog: CatalogConfig::default(),
            connections: ConnectionConfig::default(),
            resources: Default::default(),
            runtime_watchdog: false,
        }
    }
}

impl Config {
    /// The watermarks and reservation cap for a memory budget of
    /// `memory_budget_bytes`: `watermarks.high` if set, else
    /// `watermarks.high_memory_percent` of the budget ÷ the idle member
    /// charge; low = `watermarks.low` (capped at high) else 15% below high;
    /// reservations = `relay.max_reservations` else the high watermark.
    pub fn sizing(&self, memory_budget_bytes: u64) -> Sizing {
        Sizing::new(
            SizingFlags {
                high_watermark: self.watermarks.high,
                low_watermark: self.watermarks.low,
                relay_max_reservations: self.relay.max_reservations,
                high_watermark_memory_percent: self.watermarks.high_memory_percent,
            },
            &self.resources,
            memory_budget_bytes,
        )
    }

    /// What the default resource budgets derive from: the watermarks in
    /// effect and the relay caps.
    pub(crate) fn budget_watermarks(&self, sizing: &Sizing) -> Watermarks {
        Watermarks {
            high_watermark: sizing.high_watermark,
            relay_max_circuits: u32::try_from(self.relay.max_circuits).unwrap_or(u32::MAX),
            relay_max_reservations: u32::try_from(sizing.relay_max_reservations)
                .unwrap_or(u32::MAX),
        }
    }
}

/// Warns when an explicit `--high-watermark` is more than the memory budget
/// holds even with every member idle (connection and ping streams only):
/// then the memory budget, not the watermark, decides when members are
/// refused (see docs/scalability.md). A sized watermark always fits.
pub(crate) fn check_watermarks(sizing: &Sizing, budgets: &Budgets) -> bool {
    let over = u64::from(sizing.high_watermark) > sizing.members_that_fit;
    if over {
        tracing::warn!(
            high_watermark = sizing.high_watermark,
            low_watermark = sizing.low_watermark,
            memory_budget_bytes = budgets.memory_bytes,
            idle_member_charge_bytes = sizing.idle_member_charge_bytes,
            members_that_fit = sizing.members_that_fit,
            "the memory budget holds fewer members than --high-watermark; lower it or raise the memory limit"
        );
    }
    over
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memory budget the router derives from a container limit of `gib` GiB.
    fn budget_of(gib: u64) -> u64 {
        crate::resources::memory::budget(
            gib << 30,
            crate::resources::config::DEFAULT_MEMORY_BUDGET_PERCENT,
        )
    }

    #[test]
    fn the_default_high_watermark_is_sized_from_the_memory_budget() {
        let c = Config::default();
        let s = c.sizing(budget_of(2));
        // 2 GiB × 75% × 50% ÷ (64 KiB + 2 × 4 KiB) = 10,922 members: above
        // the 6,667 a router needs for 10,000 members × K=2 on 4 routers
        // with one lost.
        assert_eq!(s.idle_member_charge_bytes, 72 * 1024);
        assert_eq!(s.high_watermark, 10_922);
        assert!(s.high_watermark > 6_667);
        assert_eq!(s.low_watermark, 10_922 * 85 / 100);
        assert_eq!(s.relay_max_reservations, 10_922);
        assert!(s.sized_from_memory);
        assert_eq!(s.members_that_fit, 2 * 10_922 + 1);
        // The fallback limit (1 GiB) holds half as many.
        assert_eq!(c.sizing(budget_of(1)).high_watermark, 5_461);
        // A tiny budget still admits one member.
        assert_eq!(c.sizing(1).high_watermark, 1);
    }

    #[test]
    fn flags_win_over_the_sized_watermark() {
        let c = Config {
            watermarks: WatermarkConfig {
                high: Some(200),
                low: Some(300),
                ..Default::default()
            },
            relay: RelayConfig {
                max_reservations: Some(50),
                ..Default::default()
            },
            ..Default::default()
        };
        let s = c.sizing(budget_of(2));
        assert_eq!(
            (s.high_watermark, s.low_watermark, s.relay_max_reservations),
            (200, 200, 50),
            "low is capped at high"
        );
        assert!(!s.sized_from_memory);
        let mut c = Config {
            watermarks: WatermarkConfig {
                high_memory_percent: 25,
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(c.sizing(budget_of(2)).high_watermark, 5_461);
        c.resources.connection_charge_bytes = 1 << 20;
        assert_eq!(
            c.sizing(budget_of(2)).idle_member_charge_bytes,
            (1 << 20) + 8 * 1024
        );
    }

    #[test]
    fn sizing_never_overflows() {
        assert_eq!(high_watermark_for_budget(u64::MAX, 100, 1), u32::MAX);
        assert_eq!(high_watermark_for_budget(0, 50, 0), 1);
        assert_eq!(
            high_watermark_for_budget(1000, 200, 10),
            100,
            "percent capped at 100"
        );
    }

    #[test]
    fn only_a_watermark_above_what_the_budget_holds_warns() {
        let budget = 768 << 20;
        let budgets = |c: &Config| {
            crate::resources::budgets(&c.resources, c.budget_watermarks(&c.sizing(budget)), budget)
        };
        let sized = Config::default();
        let b = budgets(&sized);
        assert!(!check_watermarks(&sized.sizing(budget), &b), "sized fits");
        let explicit = Config {
            watermarks: WatermarkConfig {
                high: Some(20_000),
                ..Default::default()
            },
            ..Default::default()
        };
        let s = explicit.sizing(budget);
        assert_eq!(s.members_that_fit, 10_922);
        assert!(
            check_watermarks(&s, &b),
            "20,000 idle members need more than 768 MiB"
        );
        let fits = Config {
            watermarks: WatermarkConfig {
                high: Some(10_000),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(!check_watermarks(&fits.sizing(budget), &b));
    }
}
