//! The agentmesh control plane and its client.
//!
//! - [`client`]: the client routers and members use (retries bounded by time,
//!   with jitter). Always compiled; needs no server dependencies.
//! - [`clock`]: the monotonic clock shared by the limiter and the client.
//! - With the default `server` feature: the server itself, started as a value
//!   with `spawn(Config) -> Handle`.

pub mod client;
pub mod clock;

pub use client::{Client, ClientConfig, ClientError, retry_after};
