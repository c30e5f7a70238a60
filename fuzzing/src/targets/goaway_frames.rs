//! `/agentmesh/goaway/1`, both directions: every input is read as the
//! `GoAway` a member receives (`agentmesh_wire::goaway::decode` and the
//! stream reader) and as the `GoAwayAck` a router receives.
//!
//! A go-away that decodes gets what the member does with it: its reason,
//! and its alternatives turned into candidates (a PeerId and at least one
//! address that parses as a multiaddr, which must survive its own binary
//! round trip).

use agentmesh_proto::identity::PeerId;
use agentmesh_proto::pb::mesh::{GoAwayAck, GoAwayReason};
use agentmesh_proto::protocols::MAX_FRAME_BYTES;
use agentmesh_wire::{frame, goaway};
use libp2p::Multiaddr;

use crate::Report;
use crate::frames::check;

/// Runs one input.
pub fn run(data: &[u8]) -> Report {
    let mut report = Report::default();
    match check(data, MAX_FRAME_BYTES, goaway::decode(data)) {
        Ok(g) => {
            report.push("go_away", "ok");
            report.push(
                "reason",
                match GoAwayReason::try_from(g.reason) {
                    Ok(GoAwayReason::Draining) => "draining",
                    Ok(GoAwayReason::Overloaded) => "overloaded",
                    Ok(GoAwayReason::Unspecified) | Err(_) => "unspecified",
                },
            );
            for a in &g.alternatives {
                let Ok(peer) = PeerId::from_bytes(&a.peer_id) else {
                    report.push("alternative", "bad_peer");
                    continue;
                };
                assert_eq!(peer.to_bytes(), a.peer_id, "a PeerId with two encodings");
                let addrs: Vec<Multiaddr> = a.addrs.iter().filter_map(|s| s.parse().ok()).collect();
                for m in &addrs {
                    let again = Multiaddr::try_from(m.to_vec());
                    assert_eq!(again.as_ref().ok(), Some(m), "multiaddr {m} round trip");
                }
                if let Some(l) = &a.load {
                    let load = if l.high_watermark > 0 {
                        f64::from(l.attached_members) / f64::from(l.high_watermark)
                    } else {
                        f64::from(l.attached_members)
                    };
                    assert!(load.is_finite() && load >= 0.0);
                }
                report.push(
                    "alternative",
                    if addrs.is_empty() { "no_addrs" } else { "ok" },
                );
            }
        }
        Err(e) => report.push("go_away", e),
    }
    match check::<GoAwayAck>(data, MAX_FRAME_BYTES, frame::decode(data, MAX_FRAME_BYTES)) {
        Ok(_) => report.push("ack", "ok"),
        Err(e) => report.push("ack", e),
    }
    report
}
