//! One module per fuzz target, each with a `run(&[u8]) -> Report`.
//!
//! - [`credential`]: `credential::verify` on claims the harness signs.
//! - [`enroll_proof`]: the proof of possession the control plane checks on
//!   Enroll, Refresh, RouterLease and Watch, bound to its request.
//! - [`auth_frames`], [`goaway_frames`], [`catalog_frames`],
//!   [`call_frames`]: each protocol's request and answer frames.
//! - [`policy_frames`]: the policy push a member reads, its ack, and the
//!   held-policy acceptance of the policy it carries.
//! - [`revocation_list`]: the signed revocation list a member or router is
//!   offered, and which of two lists is current.
//! - [`record`]: signed service records.
//! - [`trust_keys`]: key sets and revocation lists given to `Trust`.

pub mod auth_frames;
pub mod call_frames;
pub mod catalog_frames;
pub mod credential;
pub mod enroll_proof;
pub mod goaway_frames;
pub mod policy_frames;
pub mod record;
pub mod revocation_list;
pub mod trust_keys;
