//! A router under real nodes: go-away, the drain of the router binary and
//! hostile strangers against it (`hostile_auth`, `hostile_refused`, `hostile_handshakes`,
//! and `hostile_dialed` for a peer it dialed; sharing `hostile_kit`), sharing the router
//! harness in [`support`] and the mesh of routers and nodes in [`mesh`].

mod mesh;
mod support;

mod drain_binary;
mod goaway;
mod hostile_auth;
mod hostile_dialed;
mod hostile_handshakes;
mod hostile_kit;
mod hostile_refused;
mod log_noise;
mod policy;
mod policy_push;
