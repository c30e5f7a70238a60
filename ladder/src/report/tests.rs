//! The report's JSON and markdown carry the fields the issues ask for.

use super::*;
use crate::observe::AllocatorBytes;
use crate::prom::Metrics;

#[test]
fn markdown_and_json_carry_the_issue_fields() {
    let report = Report {
        steps: vec![StepRecord {
            step: 1,
            joined: PhaseRecord {
                joining: 10,
                enrolled: 10,
                ready: 9,
                first_call_ok: 9,
                ready_ms: P50P95 {
                    p50: Some(400),
                    p95: Some(900),
                },
                ..PhaseRecord::default()
            },
            routers: vec![RouterSnapshot {
                name: "r0".into(),
                attached: 7,
                rss_bytes: Some(10 * 1_048_576),
                ..RouterSnapshot::default()
            }],
            ..StepRecord::default()
        }],
        hold: Some(HoldRecord {
            secs: 30,
            members_flapped: 1,
            flap_records: vec![crate::wire::FlapRecord {
                member: 7,
                peer_id: "12D3KooWmember".into(),
                at_secs: 301.5,
                routers_before: vec!["r0".into(), "r3".into()],
                leaving_before: vec!["r3".into()],
                routers_after: Vec::new(),
                last_router_error: Some("router r1: connection failed".into()),
            }],
            ..HoldRecord::default()
        }),
        events: Events {
            drain_router: Some(EventRecord {
                at_secs: 10,
                target: EventTarget {
                    target: Some("r2".into()),
                    target_attached_before: Some(120),
                    ..EventTarget::default()
                },
                calls: WindowCalls {
                    calls_ok: 40,
                    calls_failed: 2,
                    calls_unfinished: 3,
                    call_errors: [
                        ("call did not return within 22s".to_string(), 1),
                        ("echo not returned within 10s".to_string(), 1),
                    ]
                    .into(),
                    calls_direct: 30,
                    warm_direct: 19,
                    warm_relayed: 1,
                    direct_counts: [("open".to_string(), 31), ("upgrade:direct".to_string(), 30)]
                        .into(),
                    warm_paths: [
                        ("relayed>direct".to_string(), 19),
                        ("relayed>relayed".to_string(), 1),
                    ]
                    .into(),
                    warm_relayed_by_provider: [("xYz123".to_string(), 1)].into(),
                },
                fleet: FleetWindow {
                    below_k_routers: 3,
                    below_k_records: vec![crate::wire::BelowKRecord {
                        member: 9,
                        peer_id: "12D3KooWother".into(),
                        at_ms: 1200,
                        back_ms: Some(86_000),
                        routers_before: vec!["r2".into(), "r3".into()],
                        routers_after: vec!["r3".into()],
                        last_router_error: Some("router r0: refused".into()),
                    }],
                    ..FleetWindow::default()
                },
                router_relay: [
                    ("r0:relayed_bytes".to_string(), 2 * 1_048_576),
                    ("r1:relayed_bytes".to_string(), 1_048_576),
                    ("r0:circuits_accepted".to_string(), 5),
                ]
                .into(),
                router_cpu_secs: Some(1.5),
                ..EventRecord::default()
            }),
            ..Events::default()
        },
        failures: Failures {
            first_call_errors: [("call: no_providers".to_string(), 3)].into(),
            ..Failures::default()
        },
        ..Report::default()
    };
    // The after samples come from real scrapes: one router serving the
    // allocator gauges, one old binary without them.
    let page = include_str!("../../testdata/router-after-ladder.metrics");
    let mut with = RouterSnapshot {
        name: "r0".into(),
        up: true,
        rss_bytes: Some(40 * 1_048_576),
        rss_anon_bytes: Some(25 * 1_048_576),
        ..RouterSnapshot::default()
    };
    with.allocator = AllocatorBytes::from_metrics(&Metrics::parse(page));
    let old_page: String = page
        .lines()
        .filter(|l| !l.contains("agentmesh_runtime_allocator_"))
        .map(|l| format!("{l}\n"))
        .collect();
    let without = RouterSnapshot {
        name: "r1".into(),
        up: true,
        rss_bytes: Some(30 * 1_048_576),
        allocator: AllocatorBytes::from_metrics(&Metrics::parse(&old_page)),
        ..RouterSnapshot::default()
    };
    let mut report = report;
    report.pre_ladder = vec![with.clone(), without.clone()];
    report.after = Some(AfterRecord {
        secs: 60,
        samples: vec![AfterSample::of(5, &[with.clone(), without])],
        ..AfterRecord::default()
    });
    report.rounds = vec![
        RoundRecord {
            round: 1,
            joining: 13,
            ready: 13,
            first_call_ok: 10,
            exits: 0,
            completed: true,
            after: report.after.clone().map(|a| AfterRecord {
                ratio_to_pre_ladder: [("r0".to_string(), 1.0)].into(),
                ..a
            }),
        },
        RoundRecord {
            round: 2,
            joining: 13,
            ready: 12,
            first_call_ok: 9,
            exits: 1,
            completed: false,
            after: None,
        },
    ];
    let md = report.markdown();
    assert!(
        md.contains("| 1 | 13 | 13 | 10 | 0 | r0=40.0, r1=30.0 | r0=1.00 |"),
        "{md}"
    );
    assert!(
        md.contains("| 2 (deadline passed) | 13 | 12 | 9 | 1 | - | - |"),
        "{md}"
    );
    assert!(
        md.contains(
            "- t=5 s: r0=40.0 (anonymous 25.0, allocated 6.6, allocator resident 15.7), r1=30.0 (anonymous -, allocated -, allocator resident -)"
        ),
        "{md}"
    );
    assert!(
        md.contains("- pre-ladder: r0=40.0 (anonymous 25.0, allocated 6.6, allocator resident 15.7), r1=30.0"),
        "{md}"
    );
    assert!(
        md.contains("| 40/2 | 3 calls unfinished at window end; direct 30 of 40 ok calls; warm calls direct 19 of 20 (95.0%); warm calls by first>warm path relayed>direct=19, relayed>relayed=1; relayed by provider xYz123=1; members' direct counters open=31, upgrade:direct=30; routers: relayed 3.0 MiB, circuits 5, CPU 1.5 s |"),
        "{md}"
    );
    assert!(
        md.contains(
            "- drain router: window call failures by reason: call did not return within 22s=1, echo not returned within 10s=1"
        ),
        "{md}"
    );
    assert!(
        md.contains("First-call failures by reason (last attempt): call: no_providers=3."),
        "{md}"
    );
    assert!(
        md.contains("| 1 | 0 | 10 | 10 | 9 | 9 | 0.00 | -/- | 400/900 | -/- | 0 |"),
        "{md}"
    );
    assert!(md.contains("| 1 | r0 | 7 | 0 | 0 | 10.0 |"), "{md}");
    assert!(md.contains("| drain router | 10 | r2 (120 → -) |"), "{md}");
    let json = serde_json::to_value(&report).expect("json");
    for key in [
        "joining",
        "enrolled",
        "ready",
        "first_call_ok",
        "resident_before",
    ] {
        assert!(
            json["steps"][0].get(key).is_some(),
            "steps[0].{key} missing"
        );
    }
    for key in ["flaps", "exits", "fewest_ready", "members_flapped"] {
        assert!(json["hold"].get(key).is_some(), "hold.{key} missing");
    }
    assert!(
        md.contains(
            "- member 7 (12D3KooWmember) at 301.5 s: routers before r0, r3 (leaving: r3), after none; last router error: router r1: connection failed"
        ),
        "{md}"
    );
    assert!(
        md.contains(
            "- drain router: members below K (1 of 3: the earliest and the longest below K):\n  - member 9 (12D3KooWother) at 1200 ms, back at 86000 ms: routers before r2, r3, after r3; last router error: router r0: refused"
        ),
        "{md}"
    );
    assert_eq!(
        json["events"]["drain_router"]["below_k_records"][0]["back_ms"],
        86_000
    );
    let flap = &json["hold"]["flap_records"][0];
    assert_eq!(flap["peer_id"], "12D3KooWmember");
    assert_eq!(flap["routers_after"].as_array().map(Vec::len), Some(0));
    assert_eq!(flap["last_router_error"], "router r1: connection failed");
    assert!(json["events"]["drain_router"]["below_one_router"].is_u64());
    assert!(json.get("burst").is_some() && json.get("after").is_some());
    assert_eq!(json["rounds"][1]["ready"], 12);
    assert!(json["rounds"][1]["after"].is_null());
    let sample = &json["after"]["samples"][0];
    assert_eq!(sample["allocator_allocated_bytes"]["r0"], 6_963_312);
    assert_eq!(sample["allocator_active_bytes"]["r0"], 11_993_088);
    assert_eq!(sample["allocator_resident_bytes"]["r0"], 16_478_208);
    assert_eq!(sample["allocator_metadata_bytes"]["r0"], 4_093_504);
    assert!(
        sample["allocator_resident_bytes"]["r1"].is_null(),
        "{sample}"
    );
    assert_eq!(
        json["pre_ladder"][0]["allocator_allocated_bytes"],
        6_963_312
    );
    assert!(json["pre_ladder"][1]["allocator_allocated_bytes"].is_null());
    assert!(
        json["steps"][0]["routers"][0]
            .as_object()
            .expect("router")
            .contains_key("allocator_resident_bytes")
    );
}

#[test]
fn control_plane_memory_per_member_is_the_growth_over_the_members() {
    let m = ControlPlaneMemory::between(Some(40 << 20), Some((40 << 20) + 10_000 * 3_000), 10_000)
        .expect("both readings");
    assert_eq!(m.per_member_bytes, 3_000);
    assert!(
        m.summary()
            .contains("2.9 KiB per member over 10000 members"),
        "{}",
        m.summary()
    );
    // RSS below the pre-ladder reading is no growth, not an underflow.
    let shrunk = ControlPlaneMemory::between(Some(50), Some(40), 10).expect("both readings");
    assert_eq!(shrunk.per_member_bytes, 0);
    assert_eq!(ControlPlaneMemory::between(None, Some(1), 1), None);
    assert_eq!(ControlPlaneMemory::between(Some(1), Some(1), 0), None);
}

/// Replica events: one row per kill in time order beside the other events,
/// their details in the notes, the `control_planes` lines and JSON.
#[test]
fn replica_events_and_the_control_planes_record_are_rendered() {
    use crate::replicas::leases::{LeaseRecord, RouterLeases};
    use crate::replicas::monitor::{PgConnectionsRecord, SigningKeysRecord};
    use crate::replicas::record::{ControlPlanesRecord, ReplicaEvent, RollingStep};
    let kill = |at: u64, target: &str| EventRecord {
        at_secs: at,
        target: EventTarget {
            target: Some(target.into()),
            ..EventTarget::default()
        },
        control_plane_ready_ms: Some(250),
        calls: WindowCalls {
            calls_ok: 30,
            ..WindowCalls::default()
        },
        replica: Some(ReplicaEvent {
            seed: Some(35),
            live: vec!["cp0".into(), "cp1".into(), "cp2".into()],
            target_watchers: Some(4),
            ..ReplicaEvent::default()
        }),
        ..EventRecord::default()
    };
    let rolling = EventRecord {
        at_secs: 45,
        replica: Some(ReplicaEvent {
            rolling: vec![RollingStep {
                replica: "cp1".into(),
                exited_ms: 17,
                ready_ms: Some(221),
                ..RollingStep::default()
            }],
            ..ReplicaEvent::default()
        }),
        ..EventRecord::default()
    };
    let report = Report {
        events: Events {
            kill_control_plane: vec![kill(30, "cp0"), kill(60, "cp2")],
            rolling_restart_control_planes: Some(rolling),
            ..Events::default()
        },
        control_planes: Some(ControlPlanesRecord {
            replicas: 3,
            public_url: "http://127.0.0.1:7400".into(),
            kill_every_secs: Some(30),
            kill_seed: Some(35),
            kills: 2,
            router_leases: LeaseRecord {
                lease_ttl_secs: 30,
                lapses: 1,
                routers_lapsed: 1,
                by_router: [(
                    "r0".to_string(),
                    RouterLeases {
                        lapses: 1,
                        max_gap_ms: 31_000,
                        ..RouterLeases::default()
                    },
                )]
                .into(),
                ..LeaseRecord::default()
            },
            signing_keys: Some(SigningKeysRecord {
                created: Some(2),
                rotations_due: 1,
                scheduled_rotations: 1,
                one_per_rotation: Some(false),
                ..SigningKeysRecord::default()
            }),
            postgres_connections: Some(PgConnectionsRecord {
                max_connections: Some(100),
                peak: Some(25),
                last: Some(13),
                samples: 40,
                ..PgConnectionsRecord::default()
            }),
            ..ControlPlanesRecord::default()
        }),
        ..Report::default()
    };
    let md = report.markdown();
    let first = md.find("| kill control plane #1 | 30 | cp0 |").expect(&md);
    let rolled = md
        .find("| rolling restart control planes | 45 |")
        .expect(&md);
    let second = md.find("| kill control plane #2 | 60 | cp2 |").expect(&md);
    assert!(first < rolled && rolled < second, "{md}");
    assert!(
        md.contains("seed 35, drawn among cp0 cp1 cp2; 4 watch streams on it"),
        "{md}"
    );
    assert!(md.contains("cp1: exited 17 ms, ready 221 ms"), "{md}");
    assert!(
        md.contains("lapsed router leases: 1 (1 routers; TTL 30 s"),
        "{md}"
    );
    assert!(md.contains("r0=31.0"), "{md}");
    assert!(md.contains("NOT one key per rotation"), "{md}");
    assert!(
        md.contains("peak 25, last 13 of max_connections 100"),
        "{md}"
    );
    let json = serde_json::to_value(&report).expect("json");
    assert_eq!(
        json["events"]["kill_control_plane"][1]["replica"]["seed"],
        35
    );
    assert_eq!(json["control_planes"]["router_leases"]["lapses"], 1);
    assert_eq!(
        json["control_planes"]["signing_keys"]["one_per_rotation"],
        false
    );
    // Events without replica details carry no `replica` key.
    let plain = serde_json::to_value(EventRecord::default()).expect("json");
    assert!(plain.get("replica").is_none(), "{plain}");
}
