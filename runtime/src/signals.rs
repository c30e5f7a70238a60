//! The signals that stop every agentmesh program: SIGINT (Ctrl-C) and
//! SIGTERM (`kill`, a CI job's timeout, a container stop) lead to the same
//! graceful stop.
//!
//! Both are registered once, before the program starts anything: a SIGTERM
//! that arrives as soon as the program logs its address (a supervisor or a
//! test stopping it at once) would otherwise meet the signal's default
//! action and end the process without its drain; and a signal arriving
//! while a loop is busy between two waits is kept for the next wait, where
//! a fresh `tokio::signal::ctrl_c()` per wait would have missed it.

use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGINT and SIGTERM, registered once.
#[derive(Debug)]
pub struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
}

impl StopSignals {
    /// Registers both handlers (from here on neither signal kills the
    /// process outright: [`StopSignals::recv`] reports them).
    pub fn install() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for the next SIGINT or SIGTERM and names it. Cancel-safe: a
    /// signal that arrived before the call is reported at once.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}
