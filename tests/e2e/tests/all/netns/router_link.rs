//! A router whose host loses its link is replaced by its members (K = 2):
//! each member moves to the third router, and none of them is ever not
//! ready meanwhile (the other router holds it).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use agentmesh_netns::NatKind;

use super::support::*;

const K: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_replace_a_router_whose_host_loses_its_link_without_losing_readiness() {
    let Some(mut net) = Net::start("router_link", &[]).await else {
        return;
    };
    for name in ["r1", "r2", "r3"] {
        net.add_router(name).await;
    }
    let mut members = Vec::new();
    for (name, nat) in [
        ("pub", None),
        ("eim", Some(NatKind::EndpointIndependent)),
        ("sym", Some(NatKind::EndpointDependent)),
    ] {
        let (host, _gw) = net.member_host(name, nat).await;
        let spec = MemberSpec {
            routers: K,
            ..Default::default()
        };
        members.push(net.member(name, host, &spec).await);
    }
    all_ready(&mut members).await;
    let members = Arc::new(members);
    let held = {
        let members = members.clone();
        eventually("every member on K routers", move || {
            let members = members.clone();
            async move {
                let mut held = Vec::new();
                for m in members.iter() {
                    let r = m.reserved().await;
                    if r.len() < K {
                        return None;
                    }
                    held.push(r);
                }
                Some(held)
            }
        })
        .await
    };
    // The router most members hold (three members on two of three routers:
    // at least two of them).
    let victim = net
        .routers
        .iter()
        .max_by_key(|r| {
            held.iter()
                .filter(|h| h.contains(&r.peer_id.to_string()))
                .count()
        })
        .expect("routers");
    let on_victim = held
        .iter()
        .filter(|h| h.contains(&victim.peer_id.to_string()))
        .count();
    assert!(on_victim >= 2, "{on_victim} members on {}", victim.name);
    let victim_id = victim.peer_id.to_string();

    // Readiness of every member, sampled from inside its host until the end.
    let stop = Arc::new(AtomicBool::new(false));
    let (samples, lost) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let sampler = {
        let (members, stop, samples, lost) =
            (members.clone(), stop.clone(), samples.clone(), lost.clone());
        tokio::spawn(async move {
            let mut lost_by = HashSet::new();
            while !stop.load(Ordering::Relaxed) {
                for m in members.iter() {
                    samples.fetch_add(1, Ordering::Relaxed);
                    if !m.is_ready().await {
                        lost.fetch_add(1, Ordering::Relaxed);
                        lost_by.insert(m.name.clone());
                    }
                }
                tokio::time::sleep(POLL).await;
            }
            lost_by
        })
    };

    victim.host.set_uplink(false).await.expect("down");
    {
        let (members, victim_id) = (members.clone(), victim_id.clone());
        eventually(
            "every member on K routers, none of them the cut-off one",
            move || {
                let (members, victim_id) = (members.clone(), victim_id.clone());
                async move {
                    for m in members.iter() {
                        let r = m.reserved().await;
                        if r.len() < K || r.contains(&victim_id) {
                            return None;
                        }
                    }
                    Some(())
                }
            },
        )
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    let lost_by = sampler.await.expect("sampler");
    let samples = samples.load(Ordering::Relaxed);
    assert!(samples >= members.len() as u64, "{samples} samples");
    assert_eq!(
        lost.load(Ordering::Relaxed),
        0,
        "readiness lost ({samples} samples) by {lost_by:?}"
    );
    victim.host.set_uplink(true).await.expect("up");
}
