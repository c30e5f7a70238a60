//! Several control-plane replicas on one PostgreSQL database (issue 35):
//! the flags of their hold events and their checks ([`config`]), which
//! replica an event hits ([`choice`]: the seeded kill draws, the replica
//! the routers do not watch), what the run watches beside the fleet while
//! they come and go ([`leases`] and [`monitor`]: router leases,
//! PostgreSQL connections, signing keys) and how it is reported
//! ([`record`]).
//!
//! The processes themselves, and reading their Watch streams, memory and
//! CPU, are `crate::control_planes`; the events that act on them during
//! the hold are `crate::hold` (`hold/replicas.rs`).

pub mod choice;
pub mod config;
pub mod leases;
pub mod monitor;
pub mod record;

pub use config::ReplicaEventsConfig;
