//! What the node offers and how local programs reach the mesh: the
//! services it exposes and who may call them, and the `--forward`
//! listeners and the Unix socket that carry local connections out.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use libp2p::PeerId;

/// The services this node provides (`crate::engine::records` publishes
/// them, `crate::call::inbound` serves and checks them): the local
/// backends, who may call them, and how long their published records live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicesConfig {
    /// Local TCP backends served as services (`--expose NAME=HOST:PORT`, repeatable).
    pub expose: Vec<(String, SocketAddr)>,
    /// Who may call which exposed service (`--allow NAME=label:k=v|peer:ID|any`, repeatable).
    /// A service without rules accepts any admitted member of this mesh.
    pub allow: Vec<AllowRule>,
    /// Lifetime of published service records, in whole seconds; republished
    /// at a third of it, and no more often than every second
    /// (`--record-ttl-secs`, default 300 s).
    pub record_ttl: Duration,
}

impl Default for ServicesConfig {
    fn default() -> Self {
        Self {
            expose: Vec::new(),
            allow: Vec::new(),
            record_ttl: Duration::from_secs(300),
        }
    }
}

/// The local side (`crate::listeners`): the `--forward` listeners that
/// carry local TCP connections to services, the Unix socket
/// `agentmesh-node call` and the other subcommands use, and how many
/// forwarded connections are open at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalConfig {
    /// Local listeners forwarded to services (`--forward LISTEN_ADDR=NAME`, repeatable).
    pub forward: Vec<(SocketAddr, String)>,
    /// Unix socket path (`--socket-path`); `None`: `DATA_DIR/agentmesh.sock`.
    pub socket_path: Option<PathBuf>,
    /// Do not serve the Unix socket at all (`--no-socket`; embedded fleets set it).
    pub no_socket: bool,
    /// Forwarded local connections open at once across every `--forward`
    /// listener together (`--max-forward-connections`, default 256); the
    /// Unix socket has a bound of this size of its own. Connections over it
    /// wait in the listen backlog, counted in
    /// `agentmesh_node_local_connection_waits_total{listener}`.
    pub max_forward_connections: usize,
}

impl Default for LocalConfig {
    fn default() -> Self {
        Self {
            forward: Vec::new(),
            socket_path: None,
            no_socket: false,
            max_forward_connections: 256,
        }
    }
}

/// Who may call an exposed service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowRule {
    /// The service the rule is for.
    pub service: String,
    /// What the caller must have.
    pub matcher: AllowMatcher,
}

/// One condition on a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowMatcher {
    /// Any admitted member.
    Any,
    /// The caller's credential carries label `key=value`.
    Label(String, String),
    /// The caller is this peer.
    Peer(PeerId),
}

impl AllowMatcher {
    /// Whether a caller with `peer` and `labels` matches.
    pub fn matches(&self, peer: &PeerId, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::Any => true,
            Self::Label(k, v) => labels.get(k) == Some(v),
            Self::Peer(p) => p == peer,
        }
    }
}

impl FromStr for AllowRule {
    type Err = String;

    /// Parses `NAME=label:k=v`, `NAME=peer:PEERID` or `NAME=any`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (service, rule) = s
            .split_once('=')
            .ok_or_else(|| format!("allow rule {s:?} is not NAME=RULE"))?;
        if service.is_empty() {
            return Err(format!("allow rule {s:?} has an empty service name"));
        }
        let matcher = if rule == "any" {
            AllowMatcher::Any
        } else if let Some(label) = rule.strip_prefix("label:") {
            let (k, v) = agentmesh_proto::credential::parse_label(label)?;
            AllowMatcher::Label(k, v)
        } else if let Some(peer) = rule.strip_prefix("peer:") {
            AllowMatcher::Peer(
                peer.parse()
                    .map_err(|e| format!("allow rule {s:?}: bad PeerId: {e}"))?,
            )
        } else {
            return Err(format!(
                "allow rule {s:?}: expected label:k=v, peer:PEERID or any"
            ));
        };
        Ok(Self {
            service: service.to_string(),
            matcher,
        })
    }
}

/// Whether a caller may call `service` under `rules`: no rule for the
/// service means any admitted member; otherwise any one matching rule.
pub fn is_allowed(
    rules: &[AllowRule],
    service: &str,
    peer: &PeerId,
    labels: &BTreeMap<String, String>,
) -> bool {
    let mut any_rule = false;
    for r in rules.iter().filter(|r| r.service == service) {
        any_rule = true;
        if r.matcher.matches(peer, labels) {
            return true;
        }
    }
    !any_rule
}

/// Parses `NAME=HOST:PORT` (an `--expose` value).
pub fn parse_expose(s: &str) -> Result<(String, SocketAddr), String> {
    let (name, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("expose {s:?} is not NAME=HOST:PORT"))?;
    if name.is_empty() {
        return Err(format!("expose {s:?} has an empty service name"));
    }
    let addr = addr
        .parse()
        .map_err(|e| format!("expose {s:?}: bad address: {e}"))?;
    Ok((name.to_string(), addr))
}

/// Parses `LISTEN_ADDR=NAME` (a `--forward` value).
pub fn parse_forward(s: &str) -> Result<(SocketAddr, String), String> {
    let (addr, name) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("forward {s:?} is not LISTEN_ADDR=NAME"))?;
    if name.is_empty() {
        return Err(format!("forward {s:?} has an empty service name"));
    }
    let addr = addr
        .parse()
        .map_err(|e| format!("forward {s:?}: bad address: {e}"))?;
    Ok((addr, name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_rules_parse_and_match() {
        let peer = PeerId::random();
        let other = PeerId::random();
        let rules: Vec<AllowRule> = [
            "db=label:team=data".to_string(),
            format!("db=peer:{peer}"),
            "open=any".to_string(),
        ]
        .iter()
        .map(|s| s.parse().expect("valid rule"))
        .collect();
        let data: BTreeMap<_, _> = [("team".to_string(), "data".to_string())].into();
        let web: BTreeMap<_, _> = [("team".to_string(), "web".to_string())].into();
        // Label rule matches, other label does not, peer rule matches by id.
        assert!(is_allowed(&rules, "db", &other, &data));
        assert!(!is_allowed(&rules, "db", &other, &web));
        assert!(is_allowed(&rules, "db", &peer, &web));
        // Explicit any, and no rule at all, both admit everyone.
        assert!(is_allowed(&rules, "open", &other, &BTreeMap::new()));
        assert!(is_allowed(&rules, "echo", &other, &BTreeMap::new()));
    }

    #[test]
    fn bad_allow_rules_say_why() {
        for bad in [
            "db",
            "=any",
            "db=label:novalue",
            "db=peer:xyz",
            "db=group:x",
        ] {
            let err = bad.parse::<AllowRule>().expect_err(bad);
            assert!(err.contains(bad) || err.contains("key=value"), "{err}");
        }
    }

    #[test]
    fn expose_and_forward_parse() {
        assert_eq!(
            parse_expose("echo=127.0.0.1:8080"),
            Ok(("echo".to_string(), "127.0.0.1:8080".parse().expect("addr")))
        );
        assert!(parse_expose("echo").is_err());
        assert!(parse_expose("echo=nohost").is_err());
        assert_eq!(
            parse_forward("127.0.0.1:9000=echo"),
            Ok(("127.0.0.1:9000".parse().expect("addr"), "echo".to_string()))
        );
        assert!(parse_forward("127.0.0.1:9000=").is_err());
    }
}
