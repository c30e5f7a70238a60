//! The refusal counters of the mesh's programs, read from their `/metrics`
//! before and after an attack: every counter that says something was
//! refused, dropped, preempted, timed out or failed, by its labels.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use crate::http;
use crate::prom::{Metrics, Sample};

/// Deadline of one `/metrics` read.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// Words in a counter's name that make it a refusal counter.
const REFUSAL_WORDS: [&str; 6] = [
    "refus",
    "preempt",
    "failed_login",
    "dropped",
    "timeouts",
    "blocks",
];

/// Counters by `name{label=value,…}` (name without `agentmesh_` and
/// `_total`), at one instant.
pub type Counters = BTreeMap<String, u64>;

/// The refusal counters on one `/metrics` page: counters (`_total`) whose
/// name has one of [`REFUSAL_WORDS`], and the auth and RPC counters whose
/// result is not a success (`agentmesh_router_auth_total` other than
/// `admitted`, `agentmesh_control_plane_rpc_total` other than `Ok`).
pub fn refusals(m: &Metrics) -> Counters {
    m.samples
        .iter()
        .filter(|s| is_refusal(s))
        .map(|s| (key(s), s.value.max(0.0) as u64))
        .collect()
}

fn is_refusal(s: &Sample) -> bool {
    let Some(name) = s.name.strip_suffix("_total") else {
        return false;
    };
    if REFUSAL_WORDS.iter().any(|w| name.contains(w)) {
        return true;
    }
    let label = |k: &str| s.labels.get(k).map(String::as_str);
    match name {
        "agentmesh_router_auth" => label("result").is_some_and(|r| r != "admitted"),
        "agentmesh_control_plane_rpc" => label("code").is_some_and(|c| c != "Ok"),
        _ => false,
    }
}

fn key(s: &Sample) -> String {
    let name = s.name.strip_prefix("agentmesh_").unwrap_or(&s.name);
    let name = name.strip_suffix("_total").unwrap_or(name);
    if s.labels.is_empty() {
        return name.to_string();
    }
    let labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{name}{{{}}}", labels.join(","))
}

/// A program's refusal counters now; `None` when `/metrics` did not answer.
pub async fn scrape(addr: SocketAddr) -> Option<Counters> {
    let page = http::get(addr, "/metrics", SCRAPE_TIMEOUT).await.ok()?;
    (page.status == 200).then(|| refusals(&Metrics::parse(&page.body)))
}

/// One counter before and after.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Change {
    /// At the attack's start.
    pub before: u64,
    /// After it ended.
    pub after: u64,
}

/// The counters that grew between `before` and `after` (a counter new in
/// `after` counts from 0; a program that restarted shows only growth
/// beyond its old values).
pub fn grown(before: &Counters, after: &Counters) -> BTreeMap<String, Change> {
    after
        .iter()
        .filter_map(|(k, a)| {
            let b = before.get(k).copied().unwrap_or(0);
            (*a > b).then(|| {
                (
                    k.clone(),
                    Change {
                        before: b,
                        after: *a,
                    },
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"# TYPE agentmesh_router_slots_refused counter
agentmesh_router_slots_refused_total{budget="auth",reason="source_share"} 12
agentmesh_router_slots_refused_total{budget="catalog",reason="source_share"} 0
agentmesh_router_slots_preempted_total{budget="auth"} 3
agentmesh_router_failed_logins_total{reason="silent"} 40
agentmesh_router_failed_login_blocks_total 2
agentmesh_router_auth_total{purpose="attach",result="admitted"} 900
agentmesh_router_auth_total{purpose="attach",result="silent"} 40
agentmesh_router_attached_members 800
agentmesh_router_connections_closed_total{reason="idle"} 7
agentmesh_control_plane_limiter_refusals_total{limiter="unauth_source_share"} 5000
agentmesh_control_plane_rpc_total{method="Refresh",code="Ok"} 100
agentmesh_control_plane_rpc_total{method="Refresh",code="ResourceExhausted"} 5000
agentmesh_control_plane_grpc_handshake_timeouts_total 1
agentmesh_streams_inbound_dropped_total{protocol="/agentmesh/auth/1",reason="queue_full"} 4
"#;

    #[test]
    fn refusal_counters_are_picked_by_name_and_result() {
        let c = refusals(&Metrics::parse(PAGE));
        assert_eq!(
            c.get("router_slots_refused{budget=auth,reason=source_share}"),
            Some(&12)
        );
        assert_eq!(
            c.get("router_slots_refused{budget=catalog,reason=source_share}"),
            Some(&0),
            "counters at 0 are kept: a later value is growth"
        );
        assert_eq!(c.get("router_slots_preempted{budget=auth}"), Some(&3));
        assert_eq!(c.get("router_failed_logins{reason=silent}"), Some(&40));
        assert_eq!(c.get("router_failed_login_blocks"), Some(&2));
        assert_eq!(
            c.get("router_auth{purpose=attach,result=silent}"),
            Some(&40)
        );
        assert_eq!(
            c.get("control_plane_limiter_refusals{limiter=unauth_source_share}"),
            Some(&5000)
        );
        assert_eq!(
            c.get("control_plane_rpc{code=ResourceExhausted,method=Refresh}"),
            Some(&5000)
        );
        assert_eq!(c.get("control_plane_grpc_handshake_timeouts"), Some(&1));
        assert_eq!(
            c.get("streams_inbound_dropped{protocol=/agentmesh/auth/1,reason=queue_full}"),
            Some(&4)
        );
        for absent in [
            "router_auth{purpose=attach,result=admitted}",
            "router_attached_members",
            "router_connections_closed{reason=idle}",
            "control_plane_rpc{code=Ok,method=Refresh}",
        ] {
            assert!(!c.contains_key(absent), "{absent} is no refusal");
        }
    }

    /// Real pages, scraped during a ladder's attack (router r1 under
    /// router-auth, the control plane under the flood).
    const ROUTER_PAGE: &str = include_str!("../../testdata/router-attacked.metrics");
    const CONTROL_PLANE_PAGE: &str = include_str!("../../testdata/control-plane-attacked.metrics");

    #[test]
    fn the_real_pages_give_the_attack_counters() {
        let r = refusals(&Metrics::parse(ROUTER_PAGE));
        assert_eq!(
            r.get("router_slots_refused{budget=auth,reason=source_share}"),
            Some(&668_878)
        );
        assert_eq!(r.get("router_failed_logins{reason=silent}"), Some(&3_200));
        assert_eq!(r.get("router_failed_login_blocks"), Some(&5));
        assert_eq!(r.get("router_slots_preempted{budget=auth}"), Some(&1_944));
        assert!(
            r.keys().all(|k| !k.contains("result=admitted")),
            "{:?}",
            r.keys()
        );
        let cp = refusals(&Metrics::parse(CONTROL_PLANE_PAGE));
        assert_eq!(
            cp.get("control_plane_limiter_refusals{limiter=failure_guard}"),
            Some(&39_935)
        );
        assert_eq!(
            cp.get("control_plane_rpc{code=ResourceExhausted,method=Refresh}"),
            Some(&19_967)
        );
        assert!(!cp.contains_key("control_plane_rpc{code=Ok,method=GetKeys}"));
    }

    #[test]
    fn only_counters_that_grew_are_kept() {
        let before: Counters = [("a".to_string(), 5), ("b".to_string(), 2)].into();
        let after: Counters = [
            ("a".to_string(), 9),
            ("b".to_string(), 2),
            ("c".to_string(), 1),
        ]
        .into();
        let g = grown(&before, &after);
        assert_eq!(g.len(), 2);
        assert_eq!(
            g["a"],
            Change {
                before: 5,
                after: 9
            }
        );
        assert_eq!(
            g["c"],
            Change {
                before: 0,
                after: 1
            }
        );
    }
}
