//! What a node says about itself: [`NodeStatus`], the watch value its
//! engine publishes (readiness, what `/readyz` answers); [`report`], the
//! fuller account `agentmesh-node status` and `services` print, asked over
//! the Unix socket by [`cmd`]; and [`recent`], the recent call counts both
//! carry; [`render`] their human form, with [`time`] for instants and
//! spans and `id_string` for 64-bit ids in JSON. What the engine
//! contributes is built in `engine::report`.

pub mod cmd;
mod id_string;
pub(crate) mod recent;
mod render;
pub mod report;
pub(crate) mod time;

use libp2p::PeerId;

/// A node's state as of its last change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeStatus {
    /// Holds a credential (enrolled now or earlier).
    pub enrolled: bool,
    /// Expiry of the current credential, Unix seconds.
    pub credential_expires_at_unix_secs: i64,
    /// Routers wanted (K).
    pub routers_wanted: usize,
    /// Routers that admitted us (purpose attach).
    pub admitted: Vec<PeerId>,
    /// Routers where our relay reservation is active.
    pub reserved: Vec<PeerId>,
    /// Held routers that sent go-away: kept until K others are reserved or
    /// they close us (also in `admitted`/`reserved` while they last).
    pub leaving: Vec<PeerId>,
    /// Routers in the directory matching the selector.
    pub candidates: usize,
    /// Whether this node exposes services.
    pub exposing: bool,
    /// Whether at least one reserved router accepted our current records.
    pub records_accepted: bool,
    /// Why a router refused our records the last time it was asked,
    /// naming it (e.g. `router R: not_owner: provider does not own
    /// service "x"`); `None` while none refuses them.
    pub records_refused: Option<String>,
    /// Ready: admitted with an active reservation on ≥ 1 router and, when
    /// exposing, records accepted (docs/architecture.md, "Readiness").
    pub ready: bool,
    /// Shutdown has begun.
    pub stopping: bool,
    /// The control plane's signed revocation list the node holds names
    /// its credential: no router will admit it, so it asks none.
    pub revoked: bool,
    /// The last thing that went wrong attaching to or holding a router
    /// (refused, connection failed, reservation lost, go-away), naming the
    /// router; kept until the next one, so it explains a node below K or
    /// not ready. At most 240 characters.
    pub last_router_error: Option<String>,
    /// A long-lived task of the node ended or panicked outside shutdown,
    /// naming it and why (e.g. `task engine panicked: …`, `task socket
    /// ended`): the node is not ready and should be stopped and started
    /// again (the binary exits non-zero). The first failure; never cleared.
    pub failed: Option<String>,
}

impl NodeStatus {
    /// The `/readyz` body: one line saying why (not) ready.
    pub fn readyz_line(&self) -> String {
        if self.ready {
            return format!(
                "ready: {} of {} routers reserved{}\n",
                self.reserved.len(),
                self.routers_wanted,
                if self.exposing {
                    ", records accepted"
                } else {
                    ""
                }
            );
        }
        let why = if let Some(f) = &self.failed {
            format!("failed: {f}")
        } else if self.stopping {
            "stopping".to_string()
        } else if !self.enrolled {
            "not enrolled".to_string()
        } else if self.revoked {
            "credential revoked: the control plane's signed revocation list names it, so no router admits it (ask an operator for a new token)".to_string()
        } else if self.reserved.is_empty() && self.candidates == 0 {
            format!(
                "no router reservation: no router in the directory is available (none matches the selector, or all are draining; {} admitted)",
                self.admitted.len()
            )
        } else if self.reserved.is_empty() {
            format!(
                "no router reservation yet ({} admitted, {} candidates)",
                self.admitted.len(),
                self.candidates
            )
        } else if let Some(why) = &self.records_refused {
            format!("records refused: {why}")
        } else {
            "records not yet accepted by any router".to_string()
        };
        match &self.last_router_error {
            Some(e) => format!("not ready: {why}; last router error: {e}\n"),
            None => format!("not ready: {why}\n"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_ready_says_which_router_refuses_the_records_and_why() {
        let r = PeerId::random();
        let s = NodeStatus {
            enrolled: true,
            routers_wanted: 1,
            reserved: vec![r],
            candidates: 1,
            exposing: true,
            records_refused: Some(format!(
                r#"router {r}: not_owner: provider does not own service "payments/api""#
            )),
            ..Default::default()
        };
        assert_eq!(
            s.readyz_line(),
            format!(
                "not ready: records refused: router {r}: not_owner: provider does not own service \"payments/api\"\n"
            )
        );
        let revoked = NodeStatus {
            reserved: vec![],
            revoked: true,
            last_router_error: Some(format!("router {r}: lost the connection")),
            ..s.clone()
        };
        assert_eq!(
            revoked.readyz_line(),
            format!(
                "not ready: credential revoked: the control plane's signed revocation list names it, so no router admits it (ask an operator for a new token); last router error: router {r}: lost the connection\n"
            )
        );
        let pending = NodeStatus {
            records_refused: None,
            ..s.clone()
        };
        assert_eq!(
            pending.readyz_line(),
            "not ready: records not yet accepted by any router\n"
        );
        let none = NodeStatus {
            reserved: vec![],
            candidates: 0,
            ..s
        };
        assert!(
            none.readyz_line()
                .contains("no router in the directory is available"),
            "{}",
            none.readyz_line()
        );
    }
}
