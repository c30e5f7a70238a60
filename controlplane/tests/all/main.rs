//! The control plane's integration tests, one test binary (one link in CI;
//! nextest still runs every test in its own process): real control planes on
//! loopback, real clients, the real binary. Every test whose calls reach the
//! database runs twice through [`on_both!`], as `<module>::sqlite::<test>`
//! on a SQLite file and `<module>::postgres::<test>` on a PostgreSQL
//! database of its own (see [`common::backend`]); the others run on SQLite
//! and say why in their module.
//!
//! - [`admin`]: the admin commands (`token list|create|revoke`, `node list|revoke`, `key rotate`, `policy apply`) and request ids;
//! - [`cli`]: the binary's commands and refusals;
//! - [`connection_age`]: idle connections are closed at `--grpc-max-connection-age-secs`;
//! - [`enroll`]: enrollment, refresh, leases, admin calls and the limiters;
//! - [`fleet`]: a fleet of real clients meets the limiter on a simulated clock;
//! - [`grpc_limits`]: the gRPC listener's connection, stream and message bounds;
//! - [`hostile`]: a flood from one host takes no service from routers and members;
//! - [`key_order`]: every key set served carries its generation, and a holder never takes an older one;
//! - [`malformed`]: requests that do not decode are refused, counted and charged to their source;
//! - [`nat`]: an attacker behind a NAT takes no service from the members and router behind it;
//! - [`lifecycle`]: restarts, rotation, reapers, backups, the HTTP endpoints;
//! - [`policy`]: applying, refusing, serving and distributing the policy,
//!   its commands and the start-up rules (the real binary);
//! - [`proofs`]: proofs of possession moved onto other requests are refused;
//! - [`replicas`]: replicas' watches: sent elsewhere on SIGTERM, spread after a maximum age;
//! - [`storage`]: the database under pressure (a lock held elsewhere, a backlog);
//! - [`tls`]: gRPC over TLS;
//! - [`two_processes`]: two `agentmesh-control-plane` processes on one database;
//! - [`watch`]: routers' Watch and token revocation.
//!
//! A new file is a module here: `tests/all/<name>.rs` and `mod <name>;`.

#[macro_use]
mod common;

mod admin;
mod changes;
mod cli;
mod connection_age;
mod endpoints;
mod enroll;
mod fleet;
mod grpc_limits;
mod hostile;
mod key_order;
mod lifecycle;
mod malformed;
mod nat;
mod policy;
mod proofs;
mod replica_budgets;
mod replicas;
mod storage;
mod supervisor;
mod tls;
mod two_processes;
mod watch;
