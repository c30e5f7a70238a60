//! What `agentmesh-node status` and `agentmesh-node services` show: the
//! node's own account of what it holds, asked of the engine over the
//! node's Unix socket (`STATUS`, `SERVICES`) and sent as one JSON line.
//! [`Report::render`] and [`Services::render`] give the human form.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

pub use crate::status::recent::CallCounts;

/// One router the node holds or is acquiring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterReport {
    /// Its PeerId.
    pub peer_id: String,
    /// Where it stands: dialing, authenticating, reconnecting, reserving,
    /// reserved, waiting to reserve.
    pub state: String,
    /// The address we reached it at.
    pub addr: Option<String>,
    /// It sent go-away: being replaced.
    pub leaving: bool,
    /// It said it is draining.
    pub draining: bool,
    /// It accepted our current records.
    pub records_accepted: bool,
    /// Why it refused our records the last time (e.g. `not_owner:
    /// provider does not own service "x"`). Defaulted when reading a node
    /// that predates it.
    #[serde(default)]
    pub records_refused: Option<String>,
}

/// A service this node exposes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exposed {
    /// The service name.
    pub name: String,
    /// The local backend calls are spliced to.
    pub backend: String,
}

/// A `--forward` listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forwarded {
    /// The bound local address.
    pub listen: String,
    /// The service each connection calls.
    pub service: String,
}

/// What the node holds, as of the moment it was asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// This node's PeerId.
    pub peer_id: String,
    /// Whether it is ready.
    pub ready: bool,
    /// The `/readyz` line: ready, or why not.
    pub readiness: String,
    /// Routers wanted (K).
    pub routers_wanted: usize,
    /// Routers in the directory matching the selector.
    pub router_candidates: usize,
    /// The routers held or being acquired.
    pub routers: Vec<RouterReport>,
    /// Routers that admitted us for transit (calls to providers sharing
    /// none of our routers).
    pub transit_routers: Vec<String>,
    /// Expiry of the current credential, Unix seconds.
    pub credential_expires_at_unix_secs: i64,
    /// Seconds until it expires (negative: expired).
    pub credential_expires_in_secs: i64,
    /// Services exposed.
    pub exposed: Vec<Exposed>,
    /// `--forward` listeners.
    pub forwarded: Vec<Forwarded>,
    /// Calls in flight now (inbound, forwarded, handed out).
    pub calls_in_flight: usize,
    /// Calls that ended in the last [`Report::recent_window_secs`].
    pub recent_calls: CallCounts,
    /// The window of `recent_calls`, seconds.
    pub recent_window_secs: u64,
    /// Shutdown has begun.
    pub stopping: bool,
    /// The last thing that went wrong holding routers.
    pub last_router_error: Option<String>,
    /// Version of the access policy held (0: none, every call is denied).
    /// Defaulted when reading a node that predates it.
    #[serde(default)]
    pub policy_version: u64,
    /// Epoch of the access policy held.
    #[serde(default)]
    pub policy_epoch: u64,
    /// Why a router refuses our records, naming it; `None` while none does.
    #[serde(default)]
    pub records_refused: Option<String>,
    /// Direct connections: where we listen, what routers observed, the
    /// NAT kind, the peers reached directly; `None` with `--direct=false`
    /// (and from a node that predates it).
    #[serde(default)]
    pub direct: Option<DirectReport>,
}

/// What `status` says about direct connections.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectReport {
    /// The listening address (`/ip4/A/tcp/P`), once bound.
    pub listening: Option<String>,
    /// The NAT kind the routers' observations show: `unknown` (none yet),
    /// `one_observation`, `endpoint_independent` (punches are tried),
    /// `endpoint_dependent` (no punch: calls stay relayed).
    pub nat: String,
    /// Each router's observation of our address.
    pub observed: Vec<Observation>,
    /// Peers we hold a direct connection to now.
    pub direct_peers: Vec<String>,
}

/// One router's observation of our address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// The router's PeerId.
    pub router: String,
    /// The address it saw us at (`IP:PORT`).
    pub addr: String,
}

/// A service seen in a lookup (there is no mesh-wide listing: a router
/// answers lookups by name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeenService {
    /// The service name.
    pub name: String,
    /// Providers the last lookup found (verified records).
    pub providers: usize,
    /// Seconds since that lookup.
    pub looked_up_secs_ago: u64,
}

/// The services a node can see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Services {
    /// Ours.
    pub exposed: Vec<Exposed>,
    /// Reached through `--forward` listeners.
    pub forwarded: Vec<Forwarded>,
    /// Looked up by this node's calls recently, newest first.
    pub seen: Vec<SeenService>,
}

impl Report {
    /// The human form: one fact per line.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(o, "node        {}", self.peer_id);
        let _ = writeln!(o, "readiness   {}", self.readiness.trim_end());
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
                flags.push("leaving");
            }
            if r.draining {
                flags.push("draining");
            }
            if r.records_accepted {
                flags.push("records accepted");
            }
            let refused = r
                .records_refused
                .as_ref()
                .map(|why| format!("records refused: {why}"));
            if let Some(why) = &refused {
                flags.push(why);
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
        let _ = writeln!(
            o,
            "credential  expires at {} (in {})",
            self.credential_expires_at_unix_secs,
            human_secs(self.credential_expires_in_secs)
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
        if self.policy_version == 0 && self.policy_epoch == 0 {
            let _ = writeln!(o, "policy      none held: every call is denied");
        } else {
            let _ = writeln!(
                o,
                "policy      version {} (epoch {:016x})",
                self.policy_version, self.policy_epoch
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

/// `secs` as `1h02m`, `3m05s` or `42s`.
fn human_secs(secs: i64) -> String {
    let (sign, s) = if secs < 0 { ("-", -secs) } else { ("", secs) };
    if s >= 3600 {
        format!("{sign}{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{sign}{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{sign}{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(human_secs(42), "42s");
        assert_eq!(human_secs(185), "3m05s");
        assert_eq!(human_secs(3720), "1h02m");
        assert_eq!(human_secs(-5), "-5s");
    }

    #[test]
    fn the_human_report_names_each_router_and_its_state() {
        let r = Report {
            peer_id: "12D3me".into(),
            ready: true,
            readiness: "ready: 1 of 2 routers reserved\n".into(),
            routers_wanted: 2,
            router_candidates: 3,
            routers: vec![
                RouterReport {
                    peer_id: "12D3r1".into(),
                    state: "reserved".into(),
                    addr: Some("/ip4/127.0.0.1/tcp/1".into()),
                    leaving: true,
                    draining: false,
                    records_accepted: true,
                    records_refused: None,
                },
                RouterReport {
                    peer_id: "12D3r2".into(),
                    state: "dialing".into(),
                    addr: None,
                    leaving: false,
                    draining: false,
                    records_accepted: false,
                    records_refused: Some(r#"not_owner: provider does not own service "x""#.into()),
                },
            ],
            transit_routers: vec!["12D3r3".into()],
            credential_expires_at_unix_secs: 1000,
            credential_expires_in_secs: 600,
            exposed: vec![Exposed {
                name: "echo".into(),
                backend: "127.0.0.1:7".into(),
            }],
            forwarded: vec![],
            calls_in_flight: 1,
            recent_calls: CallCounts {
                outbound_ok: 4,
                ..Default::default()
            },
            recent_window_secs: 300,
            stopping: false,
            last_router_error: None,
            policy_version: 7,
            policy_epoch: 0xab,
            records_refused: Some(
                r#"router 12D3r2: not_owner: provider does not own service "x""#.into(),
            ),
            direct: Some(DirectReport {
                listening: Some("/ip4/0.0.0.0/tcp/4500".into()),
                nat: "endpoint_dependent".into(),
                observed: vec![
                    Observation {
                        router: "12D3r1".into(),
                        addr: "10.0.0.5:4500".into(),
                    },
                    Observation {
                        router: "12D3r2".into(),
                        addr: "10.0.0.5:61000".into(),
                    },
                ],
                direct_peers: vec![],
            }),
        };
        let text = r.render();
        assert!(
            text.contains("direct      listening /ip4/0.0.0.0/tcp/4500; NAT endpoint_dependent\n"),
            "{text}"
        );
        assert!(
            text.contains("observed    10.0.0.5:61000 by router 12D3r2\n"),
            "{text}"
        );
        assert!(
            text.contains("policy      version 7 (epoch 00000000000000ab)\n"),
            "{text}"
        );
        let none = Report {
            policy_version: 0,
            policy_epoch: 0,
            ..r.clone()
        }
        .render();
        assert!(
            none.contains("policy      none held: every call is denied\n"),
            "{none}"
        );
        // A node from before the policy fields answers without them.
        let mut old = serde_json::to_value(&r).expect("json");
        let o = old.as_object_mut().expect("object");
        o.remove("policy_version");
        o.remove("policy_epoch");
        o.remove("records_refused");
        let read: Report = serde_json::from_value(old).expect("an older node's report reads");
        assert_eq!(read.policy_version, 0);
        assert!(
            text.contains("readiness   ready: 1 of 2 routers reserved\n"),
            "{text}"
        );
        assert!(
            text.contains("routers     1 of 2 reserved (3 candidates)"),
            "{text}"
        );
        assert!(
            text.contains("12D3r1  reserved at /ip4/127.0.0.1/tcp/1 [leaving, records accepted]"),
            "{text}"
        );
        assert!(
            text.contains(
                r#"12D3r2  dialing [records refused: not_owner: provider does not own service "x"]"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"records     refused by router 12D3r2: not_owner: provider does not own service "x""#
            ),
            "{text}"
        );
        assert!(text.contains("12D3r3  transit"), "{text}");
        assert!(text.contains("expires at 1000 (in 10m00s)"), "{text}");
        assert!(text.contains("exposed     echo -> 127.0.0.1:7"), "{text}");
        assert!(text.contains("outbound 4 ok, 0 failed"), "{text}");
        let json = serde_json::to_string(&r).expect("json");
        assert_eq!(serde_json::from_str::<Report>(&json).expect("parse"), r);
    }
}
