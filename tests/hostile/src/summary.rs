//! What one run of an attack did, as one line of JSON (`agentmesh-hostile
//! --json`), for programs that drive the harness as a child process (the
//! ladder): the attack's name and its counts, each a named number, so the
//! reader needs no type of this crate.

use std::collections::BTreeMap;

use serde::Serialize;

/// One run's counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The subcommand that ran (`router-auth`, `control-plane-flood`, …).
    pub attack: String,
    /// What it did, by name (`streams_opened`, `code:ResourceExhausted`, …).
    pub counts: BTreeMap<String, u64>,
}

impl Summary {
    /// A summary of `attack` with the counts `pairs`.
    pub fn new<'a>(attack: &str, pairs: impl IntoIterator<Item = (&'a str, u64)>) -> Self {
        Self {
            attack: attack.to_string(),
            counts: pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }

    /// The JSON line.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_is_one_json_object_of_counts() {
        let s = Summary::new("router-auth", [("streams_opened", 3), ("dials_failed", 0)]);
        let line = s.to_json();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).expect("json");
        assert_eq!(v["attack"], "router-auth");
        assert_eq!(v["counts"]["streams_opened"], 3);
        assert_eq!(v["counts"]["dials_failed"], 0);
    }
}
