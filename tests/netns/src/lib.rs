//! Dev-only testbed: hosts and NAT gateways from Linux network namespaces,
//! and our real programs started inside them, for tests and the ladder.
//!
//! - **Hosts** ([`Host`]): a namespace each, its own loopback and one
//!   address, joined by a veth pair to the "internet" (a bridge in a
//!   namespace of its own) or to a NAT gateway's LAN bridge. Addresses come
//!   from the testbed's own plan ([`plan`]: 10.0.0.0/16 public, 10.K.0.0/16
//!   per NAT) and exist only inside its namespaces; nothing is ever added
//!   to, or routed through, the machine's own network namespace.
//! - **NAT gateways** ([`Nat`], [`nat`]): nftables in the gateway's
//!   namespace, four kinds ([`NatKind`]): endpoint-independent mapping
//!   with address-and-port-dependent filtering (`eim`) or with
//!   endpoint-independent filtering (`full-cone`), endpoint-dependent
//!   mapping that keeps the port when it can (`edm-pp`, plain
//!   `masquerade`) or picks a random one (`symmetric`); hairpinning for
//!   hosts behind one NAT.
//! - **Links**: [`Host::set_uplink`] takes a host's (or a gateway's WAN)
//!   link down and up. There is no delay emulation (this kernel has no
//!   `netem`); nothing here depends on it.
//! - **Programs** ([`Host::program`], [`Proc`]): started with `ip netns
//!   exec`, one log file each; the test reaches their HTTP endpoints from
//!   inside a host ([`Host::http_get`], or any future on [`Host::spawn`]).
//!
//! **Names and cleanup.** Every namespace and link carries the run's
//! [`Prefix`] (family `amt`, the pid, a sequence number). A [`Testbed`]
//! removes its namespaces, with every process and link in them, when
//! dropped — also while a test panics (the programs' last log lines are
//! printed then, and the logs kept). A new testbed first sweeps the
//! leftovers of killed runs: namespaces of the family whose pid is dead.
//! Namespaces of live processes are never touched.
//!
//! **Skipping.** Namespaces need root. Tests call [`testbed_or_skip`]:
//! without root it prints `SKIPPED: <reason>` and the test returns, unless
//! [`REQUIRE_ENV`]`=1` (which `.ci/run` sets when it runs as root): then the
//! test fails instead, so CI never passes by not running them.

mod cmd;
mod enter;
pub mod error;
pub mod host;
pub mod http;
pub mod names;
pub mod nat;
pub mod plan;
pub mod sweep;
pub mod testbed;

pub use error::Error;
pub use host::process::{Proc, Program};
pub use host::{Host, Placement};
pub use http::HttpResponse;
pub use names::Prefix;
pub use nat::NatKind;
pub use testbed::{KEEP_LOGS_ENV, Nat, Testbed, unavailable};

/// Set to `1` where the namespace tests must run (CI as root): a testbed
/// that cannot be made fails the test instead of skipping it.
pub const REQUIRE_ENV: &str = "AGENTMESH_REQUIRE_NETNS";

/// Whether a missing testbed fails the test ([`REQUIRE_ENV`] is `1`).
pub fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1")
}

/// A fresh testbed for test `test`, or `None` after printing
/// `SKIPPED: <test>: <reason>` when namespaces are unavailable here and not
/// [`required`]. Panics on any other failure, and when they are required.
pub async fn testbed_or_skip(test: &str) -> Option<Testbed> {
    match Testbed::new().await {
        Ok(tb) => Some(tb),
        Err(Error::Unavailable(why)) if !required() => {
            eprintln!("SKIPPED: {test}: {why}");
            None
        }
        Err(e @ Error::Unavailable(_)) => panic!(
            "{test}: {e}; {REQUIRE_ENV}=1 here, so the namespace tests fail rather than skip"
        ),
        Err(e) => panic!("{test}: the testbed could not be built: {e}"),
    }
}
