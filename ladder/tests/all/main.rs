//! Integration tests of the real `agentmesh-ladder` binary, one module per
//! concern, linked into one test binary (nextest still runs every test in
//! its own process).

mod attack_ladder;
mod bench;
mod drain_under_cap;
mod finish;
mod hosts_ladder;
mod hosts_remote;
mod netns;
mod policy_ladder;
mod postgres_ladder;
mod remote_tls;
mod replicas_ladder;
mod restart_all_ladder;
mod small_ladder;
mod worker_protocol;
