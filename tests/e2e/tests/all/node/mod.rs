//! A node against real routers: each module one concern, sharing the node
//! harness in [`support`].

mod support;

mod budget_refusal;
mod call_budget;
mod cp_endpoints;
mod data_dir_modes;
mod drain;
mod drain_storm;
mod failover;
mod fresh_mesh;
mod goaway_hold;
mod goaway_routes;
mod held_calls;
mod hostile_calls;
mod log_noise;
mod lying_router;
mod member_tools;
mod mesh;
mod mesh_restart;
mod p2p_metrics;
mod policy;
mod policy_push;
mod policy_refusals;
mod refusals;
mod relayed_bytes;
mod relayed_idle;
mod revoke_token;
mod store_copy;
mod storm;
mod transports;
