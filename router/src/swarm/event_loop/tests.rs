//! The swarm loop driven by hand: a real swarm (nothing listens), fake
//! connection entries, commands and ticks called directly.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use libp2p::PeerId;
use libp2p::swarm::ConnectionId;
use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{ConnInfo, EventLoop, Parts};
use crate::admission::Purpose;
use crate::config::Config;
use crate::swarm::Commands;
use crate::test_support::{admission, components};

fn event_loop(adjust: impl FnOnce(&mut Config)) -> (EventLoop, Arc<Parts>) {
    let (c, owner) = components(adjust);
    let swarm = c.build_swarm().expect("swarm");
    let control = swarm.behaviour().stream.new_control();
    let p2p = libp2p::metrics::Metrics::new(&mut Registry::default());
    let (_tx, rx) = mpsc::channel(1);
    let (_qtx, qrx) = mpsc::channel(1);
    let el = EventLoop::new(
        swarm,
        c.swarm_parts(),
        super::Inputs {
            owner,
            commands: rx,
            provider_queries: qrx,
        },
        p2p,
        control,
        HashMap::new(),
    );
    (el, Arc::new(c.swarm_parts()))
}

fn closed(parts: &Parts, reason: &'static str) -> u64 {
    parts
        .metrics
        .connections_closed
        .get_or_create(&[("reason", reason)])
        .get()
}

#[tokio::test]
async fn an_admission_without_a_connection_is_dropped_and_counted() {
    let (mut el, parts) = event_loop(|_| {});
    // Verified while the member was leaving: recorded after the swarm
    // reported its last connection closed.
    let ghost = PeerId::random();
    el.owner
        .tables
        .admissions
        .write()
        .admit(ghost, admission(Purpose::Attach));
    assert_eq!(closed(&parts, "disconnected"), 0, "pre-created at 0");
    el.on_tick();
    assert!(parts.admissions.read().is_empty(), "the ghost is gone");
    assert_eq!(closed(&parts, "disconnected"), 1);
    assert_eq!(parts.metrics.attached_members.get(), 0);
    el.on_tick();
    assert_eq!(closed(&parts, "disconnected"), 1, "counted once");
}

#[tokio::test]
async fn a_trimmed_member_is_not_counted_as_missing_the_auth_deadline() {
    // Every unadmitted connection is past a zero deadline.
    let (mut el, parts) = event_loop(|c| c.auth.deadline = Duration::ZERO);
    let member = PeerId::random();
    el.owner
        .tables
        .admissions
        .write()
        .admit(member, admission(Purpose::Attach));
    el.conns.insert(
        ConnectionId::new_unchecked(1),
        ConnInfo {
            peer: member,
            inbound: true,
            since: Instant::now(),
            closing: false,
            source: None,
        },
    );
    // The trim loop's last step after the grace, answered by the loop.
    let (tx, mut rx) = mpsc::channel(1);
    let commands = Commands::new(tx, Duration::from_secs(60));
    let trim = commands.disconnect(vec![member]);
    let serve = async {
        let cmd = rx.recv().await.expect("command");
        el.on_command(cmd);
    };
    let (disconnected, ()) = tokio::join!(trim, serve);
    assert_eq!(disconnected, 1);
    assert!(parts.admissions.read().get(&member).is_none());
    // Its connection is still closing when the next tick runs.
    el.on_tick();
    assert_eq!(closed(&parts, "auth_deadline"), 0);
}

#[tokio::test]
async fn an_unadmitted_connection_past_the_deadline_is_still_closed() {
    let (mut el, parts) = event_loop(|c| c.auth.deadline = Duration::ZERO);
    el.conns.insert(
        ConnectionId::new_unchecked(1),
        ConnInfo {
            peer: PeerId::random(),
            inbound: true,
            since: Instant::now(),
            closing: false,
            source: None,
        },
    );
    el.on_tick();
    assert_eq!(closed(&parts, "auth_deadline"), 1);
    el.on_tick();
    assert_eq!(closed(&parts, "auth_deadline"), 1, "closing: counted once");
}
