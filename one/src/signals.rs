//! The signals that stop `agentmesh-one`: SIGINT (Ctrl-C) and SIGTERM
//! (`kill`, a CI job's timeout, a container stop) lead to the same drain.
//!
//! Both are registered once, at start: a signal arriving while the main
//! loop is busy between two waits is kept for the next wait, where a fresh
//! `tokio::signal::ctrl_c()` per loop pass would have missed it (and
//! without a SIGTERM handler `kill` ended the process without draining).

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
