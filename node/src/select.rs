//! Router choice: the selector filters, the prefer labels rank, and among
//! the best-ranked routers load decides with power-of-two random choices, so
//! a fleet starting together does not herd onto the emptiest router.

use std::collections::{BTreeMap, HashSet};

use agentmesh_proto::credential::labels_to_map;
use agentmesh_proto::pb::controlplane::RouterInfo;
use libp2p::{Multiaddr, PeerId};
use rand::Rng;

/// A router from the directory, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The router's PeerId.
    pub peer: PeerId,
    /// Addresses that parsed.
    pub addrs: Vec<Multiaddr>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Load as a fraction of its high watermark (or members if no watermark).
    pub load: f64,
    /// Whether it is draining.
    pub draining: bool,
    /// When its lease ends, Unix seconds (0: not from the directory, e.g.
    /// a go-away's alternative). A live router renews it every lease
    /// interval, so a later value than one seen before means it is up.
    pub lease_expires_at_unix_secs: i64,
}

impl Candidate {
    /// Parses a directory entry; `None` if its PeerId does not parse or it
    /// has no usable address.
    pub fn from_info(info: &RouterInfo) -> Option<Self> {
        let peer = PeerId::from_bytes(&info.peer_id).ok()?;
        let mut addrs: Vec<Multiaddr> = info.addrs.iter().filter_map(|a| a.parse().ok()).collect();
        // TCP first. The swarm dials up to 8 of a peer's addresses at once,
        // so this alone does not make QUIC a fallback: whichever handshake
        // ends first wins (`direct_attach_addrs` picks where it matters).
        addrs.sort_by_key(is_quic);
        if addrs.is_empty() {
            return None;
        }
        let load = info.load.as_ref().map_or(0.0, |l| {
            let members = f64::from(l.attached_members) + f64::from(l.transit_connections) / 4.0;
            if l.high_watermark > 0 {
                members / f64::from(l.high_watermark)
            } else {
                members
            }
        });
        Some(Self {
            peer,
            addrs,
            labels: labels_to_map(&info.labels),
            load,
            draining: info.draining,
            lease_expires_at_unix_secs: info.lease_expires_at_unix_secs,
        })
    }
}

/// The addresses a member with direct connections on dials to attach to a
/// router: only those of its direct transport (`quic`:
/// `--direct-transport=quic`) when the router offers any, since what the
/// router observes of that connection is the mapping punches use; all of
/// them otherwise. The swarm dials a peer's addresses at once, not in
/// order, so a TCP-first order alone would let a QUIC handshake win.
pub fn direct_attach_addrs(addrs: &[Multiaddr], quic: bool) -> Vec<Multiaddr> {
    let ours: Vec<Multiaddr> = addrs
        .iter()
        .filter(|a| is_quic(a) == quic)
        .cloned()
        .collect();
    if ours.is_empty() {
        addrs.to_vec()
    } else {
        ours
    }
}

fn is_quic(a: &Multiaddr) -> bool {
    a.iter()
        .any(|p| matches!(p, libp2p::core::multiaddr::Protocol::QuicV1))
}

/// Whether `c` carries every label of `selector` and is not draining.
pub fn matches_selector(c: &Candidate, selector: &BTreeMap<String, String>) -> bool {
    !c.draining && selector.iter().all(|(k, v)| c.labels.get(k) == Some(v))
}

fn prefer_score(c: &Candidate, prefer: &BTreeMap<String, String>) -> usize {
    prefer
        .iter()
        .filter(|(k, v)| c.labels.get(*k) == Some(*v))
        .count()
}

/// Picks up to `n` routers from `candidates`, never one in `exclude`.
pub fn choose<R: Rng>(
    candidates: &[Candidate],
    selector: &BTreeMap<String, String>,
    prefer: &BTreeMap<String, String>,
    exclude: &HashSet<PeerId>,
    n: usize,
    rng: &mut R,
) -> Vec<Candidate> {
    let mut pool: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| matches_selector(c, selector) && !exclude.contains(&c.peer))
        .collect();
    let mut chosen = Vec::with_capacity(n);
    while chosen.len() < n && !pool.is_empty() {
        let best = pool
            .iter()
            .map(|c| prefer_score(c, prefer))
            .max()
            .unwrap_or(0);
        let tier: Vec<usize> = (0..pool.len())
            .filter(|&i| prefer_score(pool[i], prefer) == best)
            .collect();
        let pick = if tier.len() == 1 {
            tier[0]
        } else {
            let a = tier[rng.gen_range(0..tier.len())];
            let mut b = tier[rng.gen_range(0..tier.len() - 1)];
            if b == a {
                b = tier[tier.len() - 1];
            }
            if pool[b].load < pool[a].load { b } else { a }
        };
        chosen.push(pool.swap_remove(pick).clone());
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn cand(labels: &[(&str, &str)], load: f64) -> Candidate {
        Candidate {
            peer: PeerId::random(),
            addrs: vec!["/ip4/127.0.0.1/tcp/1".parse().expect("addr")],
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            load,
            draining: false,
            lease_expires_at_unix_secs: 0,
        }
    }

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selector_filters_and_prefer_ranks() {
        let eu_a = cand(&[("region", "eu"), ("zone", "a")], 0.9);
        let eu_b = cand(&[("region", "eu"), ("zone", "b")], 0.1);
        let us = cand(&[("region", "us")], 0.0);
        let mut draining = cand(&[("region", "eu"), ("zone", "a")], 0.0);
        draining.draining = true;
        let all = vec![eu_a.clone(), eu_b.clone(), us.clone(), draining];
        let mut rng = StdRng::seed_from_u64(1);
        // Selector region=eu, prefer zone=a: the busy zone-a router first anyway.
        let got = choose(
            &all,
            &map(&[("region", "eu")]),
            &map(&[("zone", "a")]),
            &HashSet::new(),
            3,
            &mut rng,
        );
        assert_eq!(
            got.iter().map(|c| c.peer).collect::<Vec<_>>(),
            vec![eu_a.peer, eu_b.peer]
        );
        // Excluded routers are never chosen.
        let got = choose(
            &all,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &[us.peer].into(),
            5,
            &mut rng,
        );
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|c| c.peer != us.peer));
    }

    #[test]
    fn load_decides_by_two_choices_without_herding() {
        // Ten equal-rank routers; the emptiest must not take every member.
        let routers: Vec<Candidate> = (0..10).map(|i| cand(&[], f64::from(i) / 10.0)).collect();
        let mut rng = StdRng::seed_from_u64(7);
        let mut firsts = std::collections::HashMap::new();
        for _ in 0..1000 {
            let got = choose(
                &routers,
                &BTreeMap::new(),
                &BTreeMap::new(),
                &HashSet::new(),
                2,
                &mut rng,
            );
            assert_eq!(got.len(), 2);
            assert_ne!(got[0].peer, got[1].peer);
            *firsts.entry(got[0].peer).or_insert(0) += 1;
        }
        let emptiest = firsts.get(&routers[0].peer).copied().unwrap_or(0);
        let fullest = firsts.get(&routers[9].peer).copied().unwrap_or(0);
        // The emptiest wins more often than the fullest, but not always.
        assert!(emptiest > fullest, "{emptiest} vs {fullest}");
        assert!(emptiest < 1000, "every member herded onto one router");
        assert_eq!(fullest, 0, "the fullest router can never win a pair");
    }

    #[test]
    fn direct_members_attach_over_their_direct_transport_where_offered() {
        let tcp: Multiaddr = "/ip4/10.0.0.1/tcp/4001".parse().expect("addr");
        let quic: Multiaddr = "/ip4/10.0.0.1/udp/4001/quic-v1".parse().expect("addr");
        let addrs = [tcp.clone(), quic.clone()];
        let (only_tcp, only_quic) = (vec![tcp], vec![quic]);
        assert_eq!(direct_attach_addrs(&addrs, false), only_tcp);
        assert_eq!(direct_attach_addrs(&addrs, true), only_quic);
        // Not offered: every address, as without direct connections.
        assert_eq!(direct_attach_addrs(&only_tcp, true), only_tcp);
        assert_eq!(direct_attach_addrs(&only_quic, false), only_quic);
    }

    #[test]
    fn tcp_addresses_come_before_quic() {
        let info = RouterInfo {
            peer_id: PeerId::random().to_bytes(),
            addrs: vec![
                "/ip4/127.0.0.1/udp/4001/quic-v1".into(),
                "/ip4/127.0.0.1/tcp/4001".into(),
            ],
            ..Default::default()
        };
        let c = Candidate::from_info(&info).expect("parses");
        assert_eq!(c.addrs[0].to_string(), "/ip4/127.0.0.1/tcp/4001");
    }

    #[test]
    fn directory_entries_without_addresses_are_skipped() {
        let info = RouterInfo {
            peer_id: PeerId::random().to_bytes(),
            addrs: vec!["not an addr".into()],
            ..Default::default()
        };
        assert!(Candidate::from_info(&info).is_none());
    }
}
