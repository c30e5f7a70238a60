//! A router under real nodes: go-away and the drain of the router binary,
//! sharing the router harness in [`support`] and the mesh of routers and
//! nodes in [`mesh`].

mod mesh;
mod support;

mod drain_binary;
mod goaway;
mod hostile_auth;
