//! Endpoints named by DNS: `dns+http://NAME:PORT` (or `dns+https://`) in a
//! client's endpoint list stands for every address NAME resolves to, one
//! endpoint each (`http://ADDRESS:PORT`), like gRPC's `dns:///` target.
//! A Kubernetes headless Service resolves to every ready replica, so the
//! client spreads its watches over them, fails over between them and
//! skips one that is frozen, which a single balancing address (one
//! connection to whichever replica it picked) cannot.
//!
//! Names are resolved again every [`RESOLVE_EVERY`] (at the next call
//! after it) so replicas added or replaced in a rollout are used; an
//! answer that fails or is empty keeps the addresses held (a DNS blip
//! never leaves a client with nothing to dial), and until a name's first
//! answer the client dials the name itself (`http://NAME:PORT`, resolved
//! per connection).

use std::collections::BTreeSet;
use std::time::Duration;

/// How often names are resolved again: a replica that joins is dialled
/// within this (plus the time to the next call); one that left is
/// already skipped by failover before it.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(30);

/// How long one resolution may take before the addresses held are kept.
pub(super) const RESOLVE_DEADLINE: Duration = Duration::from_secs(5);

/// The prefix that marks a name to expand.
const DNS_PREFIX: &str = "dns+";

/// One entry of the endpoint list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Source {
    /// An address dialled as it is.
    Fixed(String),
    /// Every address `host` resolves to, at `port`, with `scheme`.
    Name {
        scheme: &'static str,
        host: String,
        port: u16,
    },
}

impl Source {
    /// Parses one endpoint as given: `dns+http(s)://HOST:PORT` is a name to
    /// expand (the port is required: there is no default to guess), any
    /// other URL is fixed.
    pub(super) fn parse(endpoint: &str) -> Result<Self, String> {
        let Some(url) = endpoint.strip_prefix(DNS_PREFIX) else {
            return Ok(Self::Fixed(endpoint.to_string()));
        };
        let (scheme, rest) = if let Some(r) = url.strip_prefix("http://") {
            ("http", r)
        } else if let Some(r) = url.strip_prefix("https://") {
            ("https", r)
        } else {
            return Err(format!(
                "{endpoint:?}: a dns+ endpoint is dns+http://NAME:PORT or dns+https://NAME:PORT"
            ));
        };
        let authority = rest.trim_end_matches('/');
        let (host, port) = authority
            .rsplit_once(':')
            .filter(|(h, _)| !h.is_empty() && !h.contains(['/', '[', ']', '@']))
            .ok_or_else(|| format!("{endpoint:?}: a dns+ endpoint names NAME:PORT"))?;
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{endpoint:?}: {port:?} is not a port"))?;
        Ok(Self::Name {
            scheme,
            host: host.to_string(),
            port,
        })
    }

    /// What is dialled before the name has been resolved: the name itself.
    pub(super) fn unresolved(&self) -> String {
        match self {
            Self::Fixed(a) => a.clone(),
            Self::Name { scheme, host, port } => format!("{scheme}://{host}:{port}"),
        }
    }

    /// The addresses this entry stands for now: a fixed one as it is; a
    /// name's from DNS, sorted, `None` when it did not answer in time or
    /// named nothing.
    pub(super) async fn resolve(&self) -> Option<Vec<String>> {
        let Self::Name { scheme, host, port } = self else {
            return Some(vec![self.unresolved()]);
        };
        let answer = tokio::time::timeout(
            RESOLVE_DEADLINE,
            tokio::net::lookup_host((host.as_str(), *port)),
        )
        .await;
        let addrs = match answer {
            Ok(Ok(addrs)) => addrs,
            Ok(Err(e)) => {
                tracing::warn!(name = %host, error = %e, "control plane name did not resolve; keeping the endpoints held");
                return None;
            }
            Err(_) => {
                tracing::warn!(name = %host, deadline = ?RESOLVE_DEADLINE, "control plane name did not resolve in time; keeping the endpoints held");
                return None;
            }
        };
        let set: BTreeSet<String> = addrs.map(|a| format!("{scheme}://{a}")).collect();
        if set.is_empty() {
            tracing::warn!(name = %host, "control plane name resolved to no address; keeping the endpoints held");
            return None;
        }
        Some(set.into_iter().collect())
    }

    pub(super) fn is_name(&self) -> bool {
        matches!(self, Self::Name { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_to_expand_and_fixed_addresses() {
        assert_eq!(
            Source::parse("http://10.0.0.1:7400"),
            Ok(Source::Fixed("http://10.0.0.1:7400".into()))
        );
        let name = Source::parse("dns+https://cp-headless.mesh.svc:7400/").expect("parses");
        assert_eq!(
            name,
            Source::Name {
                scheme: "https",
                host: "cp-headless.mesh.svc".into(),
                port: 7400
            }
        );
        assert_eq!(name.unresolved(), "https://cp-headless.mesh.svc:7400");
        for bad in [
            "dns+cp:7400",
            "dns+http://cp",
            "dns+http://cp:0",
            "dns+http://cp:http",
            "dns+http://:7400",
            "dns+http://[::1]:7400",
            "dns+http://user@cp:7400",
        ] {
            assert!(Source::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_name_becomes_every_address_it_resolves_to() {
        // `localhost` resolves without a DNS server (the hosts file) on
        // every machine, to loopback addresses only.
        let s = Source::parse("dns+http://localhost:7400").expect("parses");
        let got = s.resolve().await.expect("resolves");
        assert!(!got.is_empty());
        for a in &got {
            assert!(
                a == "http://127.0.0.1:7400" || a == "http://[::1]:7400",
                "{a}"
            );
        }
        let fixed = Source::Fixed("http://10.0.0.1:7400".into());
        assert_eq!(
            fixed.resolve().await,
            Some(vec!["http://10.0.0.1:7400".into()])
        );
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_keeps_what_is_held() {
        // `.invalid` never resolves (RFC 6761).
        let s = Source::parse("dns+http://agentmesh-control-plane.invalid:7400").expect("parses");
        assert_eq!(s.resolve().await, None);
    }
}
