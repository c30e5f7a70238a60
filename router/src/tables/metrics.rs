//! `agentmesh_router_state_commands_total{command,result}`: every command
//! to the swarm loop's tables by outcome, labels pre-created, so a loop
//! too busy to answer (`timeout`) shows before members notice.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::metrics::L2;

/// Every command label.
pub(crate) const COMMANDS: &[&str] = &[
    "admit",
    "set_keys",
    "set_revocations",
    "regroup",
    "set_directory_routers",
    "publish",
    "withdraw",
    "drop_records",
];

/// Every outcome: `ok`; `timeout` (not answered within
/// `--state-command-deadline-ms`); `closed` (the loop is gone); `expired`
/// (the loop reached it after its asker gave up, and skipped it).
pub(crate) const RESULTS: &[&str] = &["ok", "timeout", "closed", "expired"];

/// Outcomes of one command only: `set_keys` `stale` (answered, not
/// installed: a key set older than the one held).
pub(crate) const ONLY: &[(&str, &str)] = &[("set_keys", "stale")];

/// The commands' counters.
#[derive(Debug, Clone, Default)]
pub(crate) struct CommandMetrics {
    commands: Family<L2, Counter>,
}

impl CommandMetrics {
    /// Registers the counters with every label at 0.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let every = COMMANDS
            .iter()
            .flat_map(|c| RESULTS.iter().map(move |r| (*c, *r)));
        for (command, result) in every.chain(ONLY.iter().copied()) {
            let _ = m
                .commands
                .get_or_create(&[("command", command), ("result", result)]);
        }
        registry.register(
            "agentmesh_router_state_commands",
            "Commands to the swarm loop's tables (admissions, trust, router set, catalog records) by outcome; timeout: not answered within --state-command-deadline-ms; stale: a key set older than the one held, not installed",
            m.commands.clone(),
        );
        m
    }

    /// Counts one command's outcome.
    pub(crate) fn count(&self, command: &'static str, result: &'static str) {
        self.commands
            .get_or_create(&[("command", command), ("result", result)])
            .inc();
    }

    /// How many commands ended so (tests).
    #[cfg(test)]
    pub(crate) fn get(&self, command: &'static str, result: &'static str) -> u64 {
        self.commands
            .get_or_create(&[("command", command), ("result", result)])
            .get()
    }
}
