use std::collections::BTreeMap;

use crate::status::report::*;

fn report() -> Report {
    Report {
        at_unix_secs: 1_700_000_000,
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
        identity: IdentityReport {
            node_id: "n-42".into(),
            role: "member".into(),
            labels: BTreeMap::from([
                ("env".to_string(), "prod".to_string()),
                ("team".to_string(), "payments".to_string()),
            ]),
            groups: vec!["payments".into()],
            credential_issued_at_unix_secs: 1_700_000_000 - 185,
            credential_expires_at_unix_secs: 1_700_000_600,
            credential_expires_in_secs: 600,
        },
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
        policy: PolicyReport {
            policy_version: 7,
            policy_epoch: u64::MAX - 2,
            revocations_epoch: 9_007_199_254_740_993,
            revocations_generation: 3,
        },
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
    }
}

#[test]
fn the_human_report_names_each_router_and_its_state() {
    let r = report();
    let text = r.render();
    for line in [
        "readiness   ready: 1 of 2 routers reserved\n",
        "routers     1 of 2 reserved (3 candidates)\n",
        "  12D3r1  reserved at /ip4/127.0.0.1/tcp/1 [leaving, records accepted]\n",
        "  12D3r2  dialing [records refused: not_owner: provider does not own service \"x\"]\n",
        "records     refused by router 12D3r2: not_owner: provider does not own service \"x\"\n",
        "  12D3r3  transit\n",
        "exposed     echo -> 127.0.0.1:7\n",
        "direct      listening /ip4/0.0.0.0/tcp/4500; NAT endpoint_dependent\n",
        "observed    10.0.0.5:61000 by router 12D3r2\n",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
    assert!(text.contains("outbound 4 ok, 0 failed"), "{text}");
}

#[test]
fn the_human_report_reads_times_ids_labels_and_groups() {
    let r = report();
    let text = r.render();
    for line in [
        "node id     n-42 (member)\n",
        "labels      env=prod, team=payments\n",
        "groups      payments (policy version 7)\n",
        // RFC 3339 and how far from the report's own instant.
        "credential  expires at 2023-11-14T22:23:20Z (in 10m00s), issued at 2023-11-14T22:10:15Z (3m05s ago)\n",
        // Ids in full, never rounded.
        "policy      version 7 (epoch 18446744073709551613)\n",
        "revocations generation 3 (epoch 9007199254740993)\n",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
    let none = Report {
        policy: PolicyReport::default(),
        ..r.clone()
    }
    .render();
    assert!(
        none.contains("policy      none held: every call is denied\n"),
        "{none}"
    );
    assert!(
        none.contains("groups      none (no access policy held)\n"),
        "{none}"
    );
    let ungrouped = Report {
        identity: IdentityReport {
            labels: BTreeMap::new(),
            groups: vec![],
            ..r.identity.clone()
        },
        ..r
    }
    .render();
    assert!(ungrouped.contains("labels      none\n"), "{ungrouped}");
    assert!(
        ungrouped.contains("groups      none in policy version 7: it grants this node no call\n"),
        "{ungrouped}"
    );
}

#[test]
fn every_64_bit_id_is_a_string_in_the_json_and_the_json_round_trips() {
    let r = report();
    let v = serde_json::to_value(&r).expect("json");
    for (field, want) in [
        ("policy_version", "7"),
        ("policy_epoch", "18446744073709551613"),
        ("revocations_epoch", "9007199254740993"),
        ("revocations_generation", "3"),
    ] {
        assert_eq!(v[field], serde_json::Value::from(want), "{field}: {v}");
    }
    // Flattened: identity fields are top-level, times stay numbers.
    assert_eq!(v["node_id"], "n-42", "{v}");
    assert_eq!(v["labels"]["team"], "payments", "{v}");
    assert_eq!(v["groups"][0], "payments", "{v}");
    assert_eq!(v["credential_expires_in_secs"], 600, "{v}");
    let json = serde_json::to_string(&r).expect("json");
    assert_eq!(serde_json::from_str::<Report>(&json).expect("parse"), r);
}

#[test]
fn an_older_nodes_answer_still_reads() {
    let mut old = serde_json::to_value(report()).expect("json");
    let o = old.as_object_mut().expect("object");
    // Before: ids as numbers, and no identity, revocations or time fields.
    o.insert("policy_version".into(), 7.into());
    o.insert("policy_epoch".into(), 171.into());
    for gone in [
        "at_unix_secs",
        "node_id",
        "role",
        "labels",
        "groups",
        "credential_issued_at_unix_secs",
        "revocations_epoch",
        "revocations_generation",
        "records_refused",
    ] {
        o.remove(gone);
    }
    let read: Report = serde_json::from_value(old).expect("an older node's report reads");
    assert_eq!(read.policy.policy_version, 7);
    assert_eq!(read.policy.policy_epoch, 171);
    assert!(read.identity.labels.is_empty());
    let _ = read.render();
}

#[test]
fn services_name_where_each_was_seen() {
    let s = Services {
        exposed: vec![Exposed {
            name: "echo".into(),
            backend: "127.0.0.1:7".into(),
        }],
        forwarded: vec![],
        seen: vec![SeenService {
            name: "upper".into(),
            providers: 2,
            looked_up_secs_ago: 65,
        }],
    };
    let text = s.render();
    assert!(
        text.contains("echo  exposed here (backend 127.0.0.1:7)\n"),
        "{text}"
    );
    assert!(
        text.contains("upper  2 provider(s), looked up 1m05s ago\n"),
        "{text}"
    );
}
