//! What the ladder's attack mode is made of (`--attack-router-at`,
//! `--attack-control-plane-at`; the event that runs it is
//! `hold::attack`): its flags ([`config`]), the `agentmesh-hostile`
//! processes it starts ([`harness`]), the refusal counters it reads from
//! the programs' `/metrics` before and after ([`counters`]), and what the
//! report says about it ([`record`]).
//!
//! Kept below `config` and `report` (it imports neither), so both can
//! hold its types.

pub mod config;
pub mod counters;
pub mod harness;
pub mod record;

pub use config::AttackConfig;
pub use record::AttackRecord;
