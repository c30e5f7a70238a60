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
        md.contains("| 40/2 | 3 calls unfinished at window end |"),
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
