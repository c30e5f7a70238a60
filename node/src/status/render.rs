//! The human form of `agentmesh-node status` and `services`: one fact per
//! line, times as RFC 3339 in UTC with how long ago (or until), 64-bit
//! ids in full.

use std::fmt::Write as _;

use crate::status::report::{Report, Services};
use crate::status::time::{human_secs, instant};

impl Report {
    /// The human form: one fact per line.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let id = &self.identity;
        let _ = writeln!(o, "node        {}", self.peer_id);
        if !id.node_id.is_empty() {
            let _ = writeln!(o, "node id     {} ({})", id.node_id, id.role);
        }
        let labels: Vec<String> = id.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(
            o,
            "labels      {}",
            if labels.is_empty() {
                "none".to_string()
            } else {
                labels.join(", ")
            }
        );
        let _ = writeln!(o, "groups      {}", self.groups_line());
        let _ = writeln!(o, "readiness   {}", self.readiness.trim_end());
        self.render_routers(&mut o);
        let now = self.at_unix_secs;
        let _ = writeln!(
            o,
            "credential  expires at {}, issued at {}",
            instant(id.credential_expires_at_unix_secs, now),
            instant(id.credential_issued_at_unix_secs, now),
        );
        if self.exposed.is_empty() {
            let _ = writeln!(o, "exposed     none");
        }
        for e in &self.exposed {
            let _ = writeln!(o, "exposed     {} -> {}", e.name, e.backend);
        }
        for f in &self.forwarded {
            let _ = writeln!(o, "forwarded   {} -> {}", f.listen, f.service);
        }
        let c = &self.recent_calls;
        let _ = writeln!(
            o,
            "calls       {} in flight; last {}: outbound {} ok, {} failed; inbound {} ok, {} failed",
            self.calls_in_flight,
            human_secs(self.recent_window_secs as i64),
            c.outbound_ok,
            c.outbound_failed,
            c.inbound_ok,
            c.inbound_failed
        );
        let p = &self.policy;
        if p.policy_version == 0 && p.policy_epoch == 0 {
            let _ = writeln!(o, "policy      none held: every call is denied");
        } else {
            let _ = writeln!(
                o,
                "policy      version {} (epoch {})",
                p.policy_version, p.policy_epoch
            );
        }
        if p.revocations_epoch == 0 && p.revocations_generation == 0 {
            let _ = writeln!(o, "revocations none held yet");
        } else {
            let _ = writeln!(
                o,
                "revocations generation {} (epoch {})",
                p.revocations_generation, p.revocations_epoch
            );
        }
        if let Some(why) = &self.records_refused {
            let _ = writeln!(o, "records     refused by {why}");
        }
        if let Some(d) = &self.direct {
            let listening = d.listening.as_deref().unwrap_or("not yet");
            let _ = writeln!(o, "direct      listening {listening}; NAT {}", d.nat);
            for ob in &d.observed {
                let _ = writeln!(o, "observed    {} by router {}", ob.addr, ob.router);
            }
            if !d.direct_peers.is_empty() {
                let _ = writeln!(o, "direct to   {}", d.direct_peers.join(", "));
            }
        }
        if let Some(e) = &self.last_router_error {
            let _ = writeln!(o, "last error  {e}");
        }
        if self.stopping {
            let _ = writeln!(o, "stopping");
        }
        o
    }

    /// The groups line: the names, or why there are none.
    fn groups_line(&self) -> String {
        let p = &self.policy;
        if p.policy_version == 0 && p.policy_epoch == 0 {
            return "none (no access policy held)".to_string();
        }
        if self.identity.groups.is_empty() {
            return format!(
                "none in policy version {}: it grants this node no call",
                p.policy_version
            );
        }
        format!(
            "{} (policy version {})",
            self.identity.groups.join(", "),
            p.policy_version
        )
    }

    fn render_routers(&self, o: &mut String) {
        let reserved = self
            .routers
            .iter()
            .filter(|r| r.state == "reserved")
            .count();
        let _ = writeln!(
            o,
            "routers     {reserved} of {} reserved ({} candidates)",
            self.routers_wanted, self.router_candidates
        );
        for r in &self.routers {
            let mut flags = Vec::new();
            if r.leaving {
                flags.push("leaving".to_string());
            }
            if r.draining {
                flags.push("draining".to_string());
            }
            if r.records_accepted {
                flags.push("records accepted".to_string());
            }
            if let Some(why) = &r.records_refused {
                flags.push(format!("records refused: {why}"));
            }
            let flags = if flags.is_empty() {
                String::new()
            } else {
                format!(" [{}]", flags.join(", "))
            };
            let _ = writeln!(
                o,
                "  {}  {}{}{}",
                r.peer_id,
                r.state,
                r.addr
                    .as_ref()
                    .map(|a| format!(" at {a}"))
                    .unwrap_or_default(),
                flags
            );
        }
        for t in &self.transit_routers {
            let _ = writeln!(o, "  {t}  transit");
        }
    }
}

impl Services {
    /// The human form: one service per line.
    pub fn render(&self) -> String {
        let mut o = String::new();
        for e in &self.exposed {
            let _ = writeln!(o, "{}  exposed here (backend {})", e.name, e.backend);
        }
        for f in &self.forwarded {
            let _ = writeln!(o, "{}  forwarded from {}", f.service, f.listen);
        }
        for s in &self.seen {
            let _ = writeln!(
                o,
                "{}  {} provider(s), looked up {} ago",
                s.name,
                s.providers,
                human_secs(s.looked_up_secs_ago as i64)
            );
        }
        if o.is_empty() {
            o.push_str("no services seen yet (none exposed, forwarded or looked up)\n");
        }
        o
    }
}

#[cfg(test)]
mod tests;
