use super::*;
use proptest::prelude::*;

const URL: &str = "http://cp";
const NOW: i64 = 1_700_000_000;

fn cred(claims: &[u8], signature: &[u8]) -> Credential {
    Credential {
        claims: claims.to_vec(),
        signature: signature.to_vec(),
    }
}

fn label(k: &str, v: &str) -> Label {
    Label {
        key: k.into(),
        value: v.into(),
    }
}

fn lease() -> RouterLeaseRequest {
    RouterLeaseRequest {
        credential: Some(cred(b"claims", b"sig")),
        proof: None,
        addrs: vec!["/ip4/127.0.0.1/tcp/4001".into(), "/dns/r1/tcp/4001".into()],
        labels: vec![label("zone", "a"), label("tier", "edge")],
        load: Some(RouterLoad {
            attached_members: 3,
            transit_connections: 1,
            high_watermark: 100,
            low_watermark: 85,
        }),
        draining: false,
    }
}

/// `req` proven by a fresh key, then changed by `change` and verified as
/// the changed request.
fn moved<R: Bound + Clone>(
    req: &R,
    change: impl FnOnce(&mut R),
) -> Result<(PublicKey, PeerId), ProofError> {
    let k = Keypair::generate_ed25519();
    let seen = req.clone().proven(URL, &k, NOW);
    let mut other = seen.clone();
    change(&mut other);
    let p = other.proof().expect("the seen proof").clone();
    verify_proof(&other.binding(), URL, &p, NOW)
}

#[test]
fn proof_round_trip_and_refusals() {
    let k = Keypair::generate_ed25519();
    let req = EnrollRequest {
        token: "amt_x".into(),
        proof: None,
    }
    .proven("http://127.0.0.1:7400/", &k, 1000);
    let p = req.proof.clone().expect("proof");
    let b = req.binding();
    assert_eq!(b.purpose(), Purpose::Enroll);
    let (_, peer) = verify_proof(&b, "http://127.0.0.1:7400", &p, 1100).expect("valid");
    assert_eq!(peer, k.public().to_peer_id());
    // Other endpoint, too old.
    assert_eq!(
        verify_proof(&b, "http://evil:7400", &p, 1000),
        Err(ProofError::BadSignature)
    );
    assert!(matches!(
        verify_proof(&b, "http://127.0.0.1:7400", &p, 1000 + 301),
        Err(ProofError::Stale { .. })
    ));
}

/// Refresh and Watch carry the same field (a credential): the same
/// fields, but each purpose signs under its own domain.
#[test]
fn a_proof_for_one_purpose_never_verifies_for_another() {
    let c = Some(cred(b"claims", b"sig"));
    let k = Keypair::generate_ed25519();
    let refresh = RefreshRequest {
        credential: c.clone(),
        proof: None,
    }
    .proven(URL, &k, NOW);
    let watch = WatchRequest {
        credential: c,
        proof: None,
    };
    assert_eq!(refresh.binding().digest(), watch.binding().digest());
    let p = refresh.proof.clone().expect("proof");
    assert!(verify_proof(&refresh.binding(), URL, &p, NOW).is_ok());
    assert_eq!(
        verify_proof(&watch.binding(), URL, &p, NOW),
        Err(ProofError::BadSignature)
    );
    let lease = RouterLeaseRequest {
        credential: refresh.credential,
        ..Default::default()
    };
    assert_eq!(
        verify_proof(&lease.binding(), URL, &p, NOW),
        Err(ProofError::BadSignature)
    );
}

/// Enroll binds the token: another token, even the same one with a
/// space added, breaks the proof. The token itself is never in the
/// signed bytes, only its digest.
#[test]
fn an_enroll_proof_is_bound_to_its_token() {
    let req = EnrollRequest {
        token: "amt_router_token".into(),
        proof: None,
    };
    assert!(moved(&req, |_| {}).is_ok());
    for other in ["amt_member_token", "amt_router_token ", ""] {
        assert_eq!(
            moved(&req, |r| r.token = other.into()),
            Err(ProofError::BadSignature),
            "{other:?}"
        );
    }
    let peer = Keypair::generate_ed25519().public().to_peer_id();
    let msg = proof_message(&req.binding(), URL, &peer, NOW);
    assert!(
        !msg.windows(req.token.len())
            .any(|w| w == req.token.as_bytes())
    );
}

/// Refresh and Watch bind the credential: its claims, its signature,
/// whether it is there at all.
#[test]
fn refresh_and_watch_proofs_are_bound_to_their_credential() {
    let refresh = RefreshRequest {
        credential: Some(cred(b"claims", b"sig")),
        proof: None,
    };
    let watch = WatchRequest {
        credential: refresh.credential.clone(),
        proof: None,
    };
    assert!(moved(&refresh, |_| {}).is_ok());
    assert!(moved(&watch, |_| {}).is_ok());
    let others = [
        Some(cred(b"claimz", b"sig")),
        Some(cred(b"claims", b"siG")),
        Some(cred(b"claimss", b"ig")),
        Some(cred(b"", b"")),
        None,
    ];
    for c in others {
        assert_eq!(
            moved(&refresh, |r| r.credential = c.clone()),
            Err(ProofError::BadSignature),
            "refresh {c:?}"
        );
        assert_eq!(
            moved(&watch, |r| r.credential = c.clone()),
            Err(ProofError::BadSignature),
            "watch {c:?}"
        );
    }
}

/// One change to a lease.
type Change = fn(&mut RouterLeaseRequest);

/// RouterLease binds every field it asserts: each change below breaks
/// the proof.
#[test]
fn a_lease_proof_is_bound_to_every_field_it_asserts() {
    let req = lease();
    assert!(moved(&req, |_| {}).is_ok());
    let changes: Vec<(&str, Change)> = vec![
        ("credential", |r| {
            r.credential = Some(cred(b"claims", b"other"))
        }),
        ("no credential", |r| r.credential = None),
        ("an address", |r| {
            r.addrs[0] = "/ip4/192.0.2.66/tcp/4001".into()
        }),
        ("addresses reordered", |r| r.addrs.reverse()),
        ("an address dropped", |r| r.addrs.truncate(1)),
        ("an address added", |r| {
            r.addrs.push("/ip4/192.0.2.66/tcp/1".into())
        }),
        ("addresses split differently", |r| {
            r.addrs = vec!["/ip4/127.0.0.1/tcp/4001/dns".into(), "/r1/tcp/4001".into()]
        }),
        ("a label value", |r| r.labels[0].value = "b".into()),
        ("a label key", |r| r.labels[1].key = "zone".into()),
        ("a label split differently", |r| {
            r.labels[0] = label("zon", "ea")
        }),
        ("labels reordered", |r| r.labels.reverse()),
        ("labels dropped", |r| r.labels.clear()),
        ("attached members", |r| {
            r.load.as_mut().expect("load").attached_members = 4
        }),
        ("transit connections", |r| {
            r.load.as_mut().expect("load").transit_connections = 0
        }),
        ("high watermark", |r| {
            r.load.as_mut().expect("load").high_watermark = 1
        }),
        ("low watermark", |r| {
            r.load.as_mut().expect("load").low_watermark = 84
        }),
        ("no load", |r| r.load = None),
        ("draining", |r| r.draining = true),
    ];
    for (what, change) in &changes {
        assert_eq!(
            moved(&req, *change),
            Err(ProofError::BadSignature),
            "{what}"
        );
    }
    // A load that is absent and one of zeroes are sent differently, so
    // they are bound differently (the control plane reads both as zeroes).
    let absent = RouterLeaseRequest {
        load: None,
        ..lease()
    };
    assert_eq!(
        moved(&absent, |r| r.load = Some(RouterLoad::default())),
        Err(ProofError::BadSignature)
    );
}

/// A proof in the unbound v1 format, made by a program older than the
/// verifier, is refused and named as such.
#[test]
fn an_old_format_proof_is_refused_as_old() {
    let k = Keypair::generate_ed25519();
    let peer = k.public().to_peer_id();
    for req in [
        EnrollRequest {
            token: "amt_x".into(),
            proof: None,
        }
        .binding(),
        lease().binding(),
    ] {
        let v1 = head(req.purpose().domain_v1(), URL, &peer, NOW);
        let p = ProofOfPossession {
            public_key: k.public().encode_protobuf(),
            timestamp_unix_secs: NOW,
            signature: k.sign(&v1).expect("signs"),
        };
        assert_eq!(verify_proof(&req, URL, &p, NOW), Err(ProofError::OldFormat));
        // For another endpoint it is just a bad signature.
        assert_eq!(
            verify_proof(&req, "http://elsewhere", &p, NOW),
            Err(ProofError::BadSignature)
        );
    }
}

/// A proof whose timestamp is any `i64` is refused as stale, never a panic
/// or a wrap-around that slips past the age check.
#[test]
fn extreme_timestamps_are_stale_not_a_panic() {
    let k = Keypair::generate_ed25519();
    let req = EnrollRequest {
        token: "amt_x".into(),
        proof: None,
    };
    let b = req.binding();
    for (ts, now) in [
        (i64::MIN, 1_700_000_000),
        (i64::MAX, 1_700_000_000),
        (i64::MIN, i64::MAX),
        (i64::MAX, i64::MIN),
        (i64::MIN, 0),
    ] {
        let p = make_proof(&b, URL, &k, ts);
        assert_eq!(
            verify_proof(&b, URL, &p, now),
            Err(ProofError::Stale { ts, now }),
            "ts {ts}, now {now}"
        );
    }
    // The boundary itself is still accepted, at both ends of the range.
    for (ts, now) in [(i64::MIN, i64::MIN + 300), (i64::MAX, i64::MAX - 300)] {
        let p = make_proof(&b, URL, &k, ts);
        assert!(verify_proof(&b, URL, &p, now).is_ok());
    }
}

fn any_lease() -> impl Strategy<Value = RouterLeaseRequest> {
    let bytes = || proptest::collection::vec(0u8..4, 0..3);
    let text = || "[ab]{0,2}";
    (
        proptest::option::of((bytes(), bytes())),
        proptest::collection::vec(text(), 0..3),
        proptest::collection::vec((text(), text()), 0..3),
        proptest::option::of((0u32..2, 0u32..2, 0u32..2, 0u32..2)),
        any::<bool>(),
    )
        .prop_map(|(c, addrs, labels, load, draining)| RouterLeaseRequest {
            credential: c.map(|(claims, signature)| Credential { claims, signature }),
            proof: None,
            addrs,
            labels: labels.into_iter().map(|(k, v)| label(&k, &v)).collect(),
            load: load.map(|(a, t, h, l)| RouterLoad {
                attached_members: a,
                transit_connections: t,
                high_watermark: h,
                low_watermark: l,
            }),
            draining,
        })
}

proptest! {
    /// Any timestamp and clock: accepted exactly when within the age
    /// bound, and never a panic.
    #[test]
    fn staleness_matches_the_exact_distance(
        now in any::<i64>(),
        far in any::<i64>(),
        delta in -1000i64..1000,
        close in any::<bool>(),
    ) {
        // Half the cases near the boundary, half anywhere in the range.
        let ts = if close { now.saturating_add(delta) } else { far };
        let k = Keypair::generate_ed25519();
        let b = RefreshRequest::default().binding();
        let p = make_proof(&b, URL, &k, ts);
        let fresh = (i128::from(now) - i128::from(ts)).abs() <= i128::from(MAX_PROOF_AGE_SECS);
        let r = verify_proof(&b, URL, &p, now);
        prop_assert_eq!(r.is_ok(), fresh, "ts {} now {}: {:?}", ts, now, r);
    }

    /// Two leases from a small alphabet, the second the same as the
    /// first, the first with one field taken from another, or another
    /// (so they often split the same bytes differently): a proof made for
    /// one verifies for the other exactly when they are the same request.
    #[test]
    fn a_lease_proof_verifies_exactly_for_its_own_fields(
        a in any_lease(),
        other in any_lease(),
        pick in 0u8..7,
    ) {
        let b = match pick {
            0 => a.clone(),
            1 => RouterLeaseRequest { credential: other.credential, ..a.clone() },
            2 => RouterLeaseRequest { addrs: other.addrs, ..a.clone() },
            3 => RouterLeaseRequest { labels: other.labels, ..a.clone() },
            4 => RouterLeaseRequest { load: other.load, ..a.clone() },
            5 => RouterLeaseRequest { draining: other.draining, ..a.clone() },
            _ => other,
        };
        let k = Keypair::generate_ed25519();
        let p = a.clone().proven(URL, &k, NOW).proof.expect("proof");
        let r = verify_proof(&b.binding(), URL, &p, NOW);
        prop_assert_eq!(r.is_ok(), a == b, "{:?} vs {:?}: {:?}", a, b, r);
    }
}
