//! Attacks a hostile peer can make before it is authenticated (and a
//! member before its credential is checked), each bounded in count and
//! duration, so tests can run them against the real programs and the
//! ladder can run them against a mesh under load.
//!
//! Every attack reports what it did (attempts made, refused, held) so a
//! test can assert the attack really ran, not only that members survived.
//! Dev-only: never a dependency of a program.
//!
//! - [`control_plane`]: unauthenticated RPC floods at the control plane.
//! - [`router_auth`]: strangers holding a router's auth slots.
//! - [`router_refused`]: a stranger reopening refused streams in a loop.
//! - [`handshake_flood`]: TCP connections from one address, as fast as the
//!   machine allows, that stall the noise handshake or never start it.
//! - [`member`]: an enrolled member as a raw libp2p swarm (router auth,
//!   relayed circuits, raw streams), obeying no limit of its own.
//! - [`member_noise`]: policy pushes and go-aways to a member over one
//!   circuit, from a member that is not its router (refused, logged).
//! - [`provider_calls`]: silent call streams to one provider.
//! - [`held_calls`]: accepted calls held silent to one provider, from
//!   several identities of one enrollment token.
//! - [`provider_circuits`]: every circuit to one provider through a router.
//!
//! - [`lying_router`]: a compromised router (a real router credential, in
//!   the directory) telling attached members a forged or rolled-back
//!   revocation list, in its admission answers and its pushes.
//! - [`dialed_router`]: not an attack but its mirror: a router of the
//!   directory that the router under test dials, opening streams it
//!   refuses before authenticating back (it must not be taken for one).
//!
//! [`counts`] declares each attack's counts once; [`summary`] is what the
//! binary prints with `--json`. [`stranger`] dials a router as a fresh
//! PeerId from one source address.

pub mod control_plane;
pub mod counts;
pub mod dialed_router;
pub mod handshake_flood;
pub mod held_calls;
pub mod lying_router;
pub mod member;
pub mod member_noise;
pub mod provider_calls;
pub mod provider_circuits;
pub mod router_auth;
pub mod router_refused;
mod stranger;
pub mod summary;
