//! The mesh across hosts and NATs: the real binaries of the control plane,
//! routers and members, each on a host of its own built from network
//! namespaces (`agentmesh-netns`), members on public hosts or behind NAT
//! gateways (endpoint-independent, full cone, port-preserving
//! endpoint-dependent or symmetric). Calls are relayed, except in `direct`
//! and `matrix` (members with `--direct=true`). Without root each test prints `SKIPPED:` and
//! returns; `.ci/run` as root makes them fail instead.

mod support;

mod across_nats;
mod direct;
mod direct_rules;
mod matrix;
mod nat_link;
mod repunch;
mod router_link;
mod upgraded;
