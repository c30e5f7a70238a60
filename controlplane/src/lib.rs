//! The agentmesh control plane and its client.
//!
//! - [`client`]: the client routers and members use (retries bounded by time,
//!   with jitter). Always compiled; needs no server dependencies.
//! - [`clock`]: the monotonic clock shared by the limiter and the client.
//! - With the default `server` feature: the server itself, started as a value
//!   with [`spawn`]`(Config) -> Handle`, its storage, limiter, keys, reapers.

#![warn(missing_docs)]

pub mod client;
pub mod clock;
pub mod tls;

pub use client::{Client, ClientConfig, ClientError, Connections, retry_after};

#[cfg(feature = "server")]
pub mod admin;
#[cfg(feature = "server")]
pub mod admin_cli;
#[cfg(feature = "server")]
pub mod admin_list;
#[cfg(feature = "server")]
pub mod changes;
#[cfg(feature = "server")]
pub mod cli;
#[cfg(feature = "server")]
pub mod config;
#[cfg(feature = "server")]
pub mod directory;
#[cfg(feature = "server")]
pub mod duty;
#[cfg(feature = "server")]
pub mod enroll;
#[cfg(feature = "server")]
pub mod grpc_limits;
#[cfg(feature = "server")]
pub mod grpc_server;
#[cfg(feature = "server")]
pub mod guard;
#[cfg(feature = "server")]
pub mod http;
#[cfg(feature = "server")]
pub mod keys;
#[cfg(feature = "server")]
pub mod limiter;
#[cfg(feature = "server")]
pub mod malformed;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "server")]
pub mod offline;
#[cfg(feature = "server")]
pub mod policy;
#[cfg(feature = "server")]
pub mod readiness;
#[cfg(feature = "server")]
pub mod reaper;
#[cfg(feature = "server")]
pub mod refusal_log;
#[cfg(feature = "server")]
pub mod replicas;
#[cfg(feature = "server")]
pub mod request_ids;
#[cfg(feature = "server")]
pub mod request_limits;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod service;
#[cfg(feature = "server")]
pub mod signed_policy;
#[cfg(feature = "server")]
pub mod signed_revocations;
#[cfg(feature = "server")]
mod spawn_error;
#[cfg(feature = "server")]
pub mod state;
#[cfg(feature = "server")]
pub mod status;
#[cfg(feature = "server")]
pub mod store;
#[cfg(feature = "server")]
pub mod supervisor;
#[cfg(feature = "server")]
pub mod token_index;
#[cfg(feature = "server")]
pub mod tokens;
#[cfg(feature = "server")]
pub mod watch;
#[cfg(feature = "server")]
pub mod watch_hub;

#[cfg(feature = "server")]
pub use config::Config;
#[cfg(feature = "server")]
pub use server::{Handle, SpawnError, spawn, spawn_with, spawn_with_clock};
