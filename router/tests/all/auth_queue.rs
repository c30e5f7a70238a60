//! An auth stream that finds every auth slot taken waits for one in the
//! fair queue: served if a slot frees within `--auth-queue-wait-ms`, else
//! answered early — a refusal OVERLOADED with a retry-after — instead of
//! silence until the member's own deadline. Neither is a failed login.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use agentmesh_proto::pb::credential::Role;
use agentmesh_proto::pb::mesh::{AuthRefusal, Purpose, auth_response};
use agentmesh_router::Config;
use futures::AsyncWriteExt as _;
use support::cp::start_cp;
use support::{TestPeer, TestRouter, eventually};

const WAIT: Duration = Duration::from_secs(2);
const RETRY_AFTER: Duration = Duration::from_millis(1500);

fn one_slot(c: &mut Config) {
    c.auth.deadline = Duration::from_secs(60);
    c.control_plane.retry_budget = Duration::from_secs(10);
    c.auth.max_inflight_streams = 1;
    c.auth.queue_wait = WAIT;
    c.auth.busy_retry_after = RETRY_AFTER;
    c.connections.stream_timeout = Duration::from_secs(30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_auth_is_served_when_a_slot_frees_and_answered_busy_when_none_does() {
    let cp = start_cp().await;
    let r = TestRouter::start(&cp, &[], one_slot).await;
    let waits = |outcome: &str| {
        r.metric(&format!(
            r#"agentmesh_router_slots_waits_total{{budget="auth",outcome="{outcome}"}}"#
        ))
    };
    let queued = r#"agentmesh_router_slots_in_use{budget="auth_queue"}"#;
    let token = cp.token(Role::Member).await;

    // A stream that sent one length byte holds the only slot (it is slow,
    // not silent: the stream timeout, 30 s, applies to it).
    let mut holder = TestPeer::new();
    holder.connect(r.id(), r.addr.clone()).await;
    let mut slow = holder.open(r.id(), agentmesh_proto::protocols::AUTH).await;
    slow.write_all(&[64]).await.expect("write");
    slow.flush().await.expect("flush");
    eventually("the slow stream holds the auth slot", || async {
        (r.metric(r#"agentmesh_router_slots_in_use{budget="auth"}"#) == 1.0).then_some(())
    })
    .await;

    // Nobody frees it: answered busy after the wait, with the retry-after.
    let (member, cred) = TestPeer::enrolled_and_connected(&cp, &token, &r).await;
    let started = tokio::time::Instant::now();
    let resp = member
        .auth(r.id(), Some(cred.clone()), Purpose::Attach)
        .await;
    let took = started.elapsed();
    match resp.result {
        Some(auth_response::Result::Refused(ref refused)) => {
            assert_eq!(refused.reason, AuthRefusal::Overloaded as i32, "{resp:?}");
            assert_eq!(
                u128::from(refused.retry_after_ms),
                RETRY_AFTER.as_millis(),
                "{resp:?}"
            );
        }
        _ => panic!("expected a busy refusal, got {resp:?}"),
    }
    assert!(took >= WAIT, "answered before its wait ended: {took:?}");
    assert_eq!(waits("timed_out"), 1.0);
    assert_eq!(
        r.metric(r#"agentmesh_router_auth_total{purpose="attach",result="busy"}"#),
        1.0
    );

    // Asking again while the slot is still held: it waits; the holder lets
    // go meanwhile and the waiter is served.
    let member = Arc::new(member);
    let asking = {
        let (member, id) = (member.clone(), r.id());
        tokio::spawn(async move { member.auth(id, Some(cred), Purpose::Attach).await })
    };
    eventually("the second auth waits in the queue", || async {
        (r.metric(queued) == 1.0).then_some(())
    })
    .await;
    drop(slow);
    let resp = asking.await.expect("join");
    assert!(
        matches!(resp.result, Some(auth_response::Result::Admitted(_))),
        "{resp:?}"
    );
    assert_eq!(waits("served"), 1.0);
    assert_eq!(r.metric(queued), 0.0);
    // Waiting is no failed login, and a wait is no refused slot.
    for reason in ["silent", "malformed"] {
        assert_eq!(
            r.metric(&format!(
                r#"agentmesh_router_failed_logins_total{{reason="{reason}"}}"#
            )),
            0.0
        );
    }
    assert_eq!(
        r.metric(r#"agentmesh_router_slots_refused_total{budget="auth",reason="source_share"}"#),
        0.0
    );
    r.handle.shutdown().await;
}
