//! The per-source counts (`by_source.rs`) as the manager keeps them: they
//! must always equal a recount of the open connections and their peers'
//! admission, whatever order connections, admissions and removals come in.

use std::collections::HashMap;
use std::sync::Arc;

use libp2p::PeerId;
use proptest::prelude::*;

use super::budget::{Resource, Scope};
use super::by_source::SourceCount;
use super::tests::{inbound_from, manager};
use super::*;

/// The counts recomputed from the peers the manager holds.
fn recount(mgr: &ResourceManager) -> HashMap<SourceKey, SourceCount> {
    let st = mgr.state.lock();
    let mut by: HashMap<SourceKey, SourceCount> = HashMap::new();
    for u in st.peers.values() {
        for ip in &u.inbound_sources {
            let c = by.entry(*ip).or_default();
            c.connections += 1;
            c.admitted += u32::from(u.admitted);
        }
    }
    by
}

fn kept(mgr: &ResourceManager) -> HashMap<SourceKey, SourceCount> {
    let st = mgr.state.lock();
    st.sources.iter().map(|(k, c)| (*k, *c)).collect()
}

fn key(mgr: &ResourceManager, ip: &str) -> SourceKey {
    mgr.source_of(ip.parse().expect("ip"))
}

#[test]
fn hundreds_of_members_behind_one_address_leave_its_strangers_their_cap() {
    let (mgr, admitted) = manager(|c| c.unauthenticated_connections_per_ip = 2);
    let nat = "10.1.1.1";
    let mut members = Vec::new();
    for _ in 0..500 {
        let p = PeerId::random();
        // Each member connects as a stranger and is then admitted, as auth does.
        members.push((p, mgr.open_connection(p, &inbound_from(nat)).expect("conn")));
        admitted.write().insert(p);
        mgr.peer_admitted(&p);
    }
    let source = key(&mgr, nat);
    assert_eq!(mgr.unauthenticated_from(&source), 0);
    // Two strangers fit under the cap, the newcomer past it is let in (the
    // swarm evicts the oldest), the next is refused.
    let strangers: Vec<_> = (0..3)
        .map(|_| {
            mgr.open_connection(PeerId::random(), &inbound_from(nat))
                .expect("stranger")
        })
        .collect();
    assert_eq!(mgr.unauthenticated_from(&source), 3);
    let r = mgr
        .open_connection(PeerId::random(), &inbound_from(nat))
        .expect_err("past the cap");
    assert_eq!((r.resource, r.scope), (Resource::Connection, Scope::Source));
    // A member whose admission ends counts as a stranger until it leaves.
    let (gone, conn) = members.pop().expect("a member");
    admitted.write().remove(&gone);
    mgr.peer_removed(&gone);
    assert_eq!(mgr.unauthenticated_from(&source), 4);
    drop(conn);
    drop(strangers);
    assert_eq!(mgr.unauthenticated_from(&source), 0);
    assert_eq!(kept(&mgr), recount(&mgr));
}

#[test]
fn a_connection_opened_while_its_peer_is_being_admitted_counts_as_the_members() {
    let (mgr, _admitted) = manager(|_| {});
    let p = PeerId::random();
    let first = mgr
        .open_connection(p, &inbound_from("10.2.2.2"))
        .expect("first");
    // Auth admits it (on `first`) before the table says so to a second
    // connection's open: the flag set under the manager's lock decides.
    mgr.peer_admitted(&p);
    let second = mgr
        .open_connection(p, &inbound_from("10.2.2.3"))
        .expect("second");
    assert_eq!(mgr.unauthenticated_from(&key(&mgr, "10.2.2.2")), 0);
    assert_eq!(mgr.unauthenticated_from(&key(&mgr, "10.2.2.3")), 0);
    drop((first, second));
    assert!(mgr.state.lock().sources.is_empty());
}

#[derive(Debug, Clone)]
enum Op {
    Open { peer: usize, ip: usize },
    Close(usize),
    Admit(usize),
    Remove(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..6usize, 0..3usize).prop_map(|(peer, ip)| Op::Open { peer, ip }),
        (0..64usize).prop_map(Op::Close),
        (0..6usize).prop_map(Op::Admit),
        (0..6usize).prop_map(Op::Remove),
    ]
}

proptest! {
    #[test]
    fn the_counts_always_equal_a_recount(ops in proptest::collection::vec(op(), 1..80)) {
        let (mgr, admitted) = manager(|c| c.unauthenticated_connections_per_ip = 1_000);
        let peers: Vec<PeerId> = (0..6).map(|_| PeerId::random()).collect();
        let ips = ["10.3.0.1", "10.3.0.2", "2001:db8::1"];
        let mut open: Vec<Arc<ConnectionGuard>> = Vec::new();
        for op in ops {
            match op {
                Op::Open { peer, ip } => {
                    if let Ok(g) = mgr.open_connection(peers[peer], &inbound_from(ips[ip])) {
                        open.push(g);
                    }
                }
                Op::Close(i) if !open.is_empty() => {
                    let i = i % open.len();
                    drop(open.swap_remove(i));
                }
                Op::Close(_) => {}
                Op::Admit(peer) => {
                    admitted.write().insert(peers[peer]);
                    mgr.peer_admitted(&peers[peer]);
                }
                Op::Remove(peer) => {
                    admitted.write().remove(&peers[peer]);
                    mgr.peer_removed(&peers[peer]);
                }
            }
            prop_assert_eq!(kept(&mgr), recount(&mgr));
        }
        drop(open);
        prop_assert!(mgr.state.lock().sources.is_empty());
    }
}
