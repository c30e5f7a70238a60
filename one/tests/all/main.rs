//! Integration tests of the real `agentmesh-one` binary, one module per
//! concern, linked into one test binary (nextest still runs every test in
//! its own process).

mod demo;
mod restart;
mod stop;
