//! The owner's command handling: answers within the deadline or an error,
//! stale commands skipped, one writer.

use std::time::Duration;

use agentmesh_proto::pb::credential::{KeySet, PublicKey, Revocation};
use libp2p::PeerId;
use prometheus_client::registry::Registry;

use super::*;
use crate::admission::Purpose;

/// An admission of `purpose` until far in the future.
fn admission(purpose: Purpose) -> Admission {
    Admission {
        purpose,
        until: i64::MAX / 2,
        node_id: "test".into(),
        attached_routers: vec![],
        groups: None,
        push: Default::default(),
    }
}

/// Short: the tests that wait it out serve nothing, so they cannot flake.
const DEADLINE: Duration = Duration::from_millis(50);

/// Long: the tests that serve must never see it pass on a loaded machine.
const SERVED_DEADLINE: Duration = Duration::from_secs(60);

fn owner_with(deadline: Duration) -> (Owner, Views, Handle) {
    Owner::new(&mut Registry::default(), deadline, 16)
}

fn owner() -> (Owner, Views, Handle) {
    owner_with(SERVED_DEADLINE)
}

fn open() -> Conditions {
    Conditions {
        connected: true,
        draining: false,
        high_watermark: u32::MAX,
    }
}

/// A key set of epoch 7, generation `generation`, holding one key `id`.
fn key_set(id: &str, generation: u64) -> KeySet {
    KeySet {
        keys: vec![PublicKey {
            key_id: id.into(),
            ed25519: libp2p::identity::ed25519::Keypair::generate()
                .public()
                .to_bytes()
                .to_vec(),
            active_from_unix_secs: 0,
            verify_until_unix_secs: 0,
        }],
        epoch: 7,
        generation,
        epoch_created_at_unix_secs: 1_000,
    }
}

#[tokio::test]
async fn a_command_not_answered_within_its_deadline_is_an_error_and_never_applied_later() {
    let (mut owner, views, handle) = owner_with(DEADLINE);
    let peer = PeerId::random();
    // Nobody serves the queue: the ask runs out its deadline.
    let asked = handle.admit(peer, admission(Purpose::Attach), open()).await;
    assert_eq!(
        asked,
        Err(AskError::Timeout {
            command: "admit",
            deadline: DEADLINE
        })
    );
    assert_eq!(owner.tables.metrics.get("admit", "timeout"), 1);
    // The owner reaches it late: the asker gave up, so it is skipped.
    let late = owner.next().await.expect("queued");
    owner.tables.apply(late);
    assert!(
        views.admissions.read().is_empty(),
        "not applied behind the asker's back"
    );
    assert_eq!(owner.tables.metrics.get("admit", "expired"), 1);
    assert_eq!(owner.tables.metrics.get("admit", "ok"), 0);
}

#[tokio::test]
async fn a_command_to_a_stopped_owner_is_an_error() {
    let (owner, _views, handle) = owner_with(DEADLINE);
    drop(owner);
    let asked = handle.set_keys(KeySet::default()).await;
    assert_eq!(
        asked,
        Err(AskError::Closed {
            command: "set_keys"
        })
    );
}

#[tokio::test]
async fn commands_change_the_tables_the_views_read() {
    let (mut owner, views, handle) = owner();
    let peer = PeerId::random();
    let keys = key_set("k1", 1);
    let revoked = Arc::new(vec![Revocation {
        peer_id: peer.to_bytes(),
        until_unix_secs: i64::MAX / 2,
        reason: "test".into(),
        token_id: String::new(),
    }]);
    let asks = async {
        let admitted = handle.admit(peer, admission(Purpose::Attach), open()).await;
        handle.set_keys(keys).await.expect("keys");
        handle.set_revocations(revoked).await.expect("revocations");
        admitted
    };
    let admitted = owner.serve_while(asks).await;
    assert_eq!(admitted, Ok(Ok(())));
    assert!(views.admissions.read().get(&peer).is_some());
    assert_eq!(views.trust.read().key_count(), 1);
    assert!(views.trust.read().is_revoked(&peer, 1));
    assert_eq!(owner.tables.metrics.get("admit", "ok"), 1);
}

#[tokio::test]
async fn concurrent_admissions_go_through_one_writer_and_one_gate() {
    let (mut owner, views, handle) = owner();
    let full_at_one = Conditions {
        high_watermark: 1,
        ..open()
    };
    let (a, b) = (PeerId::random(), PeerId::random());
    let (h1, h2) = (handle.clone(), handle);
    let both = async {
        tokio::join!(
            h1.admit(a, admission(Purpose::Attach), full_at_one),
            h2.admit(b, admission(Purpose::Attach), full_at_one),
        )
    };
    let (ra, rb) = owner.serve_while(both).await;
    let answers = [ra.expect("answered"), rb.expect("answered")];
    assert_eq!(
        answers.iter().filter(|r| r.is_ok()).count(),
        1,
        "the gate sees the first admission before the second: {answers:?}"
    );
    assert!(answers.contains(&Err(NotAdmitted::Overloaded)));
    assert_eq!(views.admissions.read().counts().attached, 1);
}

/// `Owned` must not be `Clone`: a second writer could then exist. This
/// fails to compile (the call is ambiguous) if someone derives it.
#[test]
fn the_writer_cannot_be_cloned() {
    trait AmbiguousIfClone<A> {
        fn check() {}
    }
    impl<T> AmbiguousIfClone<()> for T {}
    #[allow(dead_code)]
    struct IsClone;
    impl<T: Clone> AmbiguousIfClone<IsClone> for T {}
    <Owned<AdmissionTable> as AmbiguousIfClone<_>>::check();
    <Owned<Trust> as AmbiguousIfClone<_>>::check();
    <Owned<HashSet<PeerId>> as AmbiguousIfClone<_>>::check();
    <Owned<CatalogStore> as AmbiguousIfClone<_>>::check();
}

#[tokio::test]
async fn the_router_set_is_the_directory_plus_the_routers_admitted() {
    let (mut owner, views, handle) = owner();
    let (listed, admitted, member) = (PeerId::random(), PeerId::random(), PeerId::random());
    let asks = async {
        let r = handle
            .admit(admitted, admission(Purpose::Router), open())
            .await;
        let m = handle
            .admit(member, admission(Purpose::Attach), open())
            .await;
        (r, m)
    };
    let (r, m) = owner.serve_while(asks).await;
    assert_eq!((r, m), (Ok(Ok(())), Ok(Ok(()))));
    {
        let set = views.router_set.read();
        assert!(
            set.contains(&admitted),
            "an admitted router gets the DHT at once"
        );
        assert!(!set.contains(&member), "a member never does");
    }
    owner
        .serve_while(handle.set_directory_routers(vec![listed]))
        .await
        .expect("answered");
    let set = views.router_set.read();
    assert!(set.contains(&listed) && set.contains(&admitted));
    assert_eq!(set.len(), 2);
}

/// Failing over to a control-plane replica that has not reloaded its keys:
/// the older set it serves is answered, counted `stale` and not installed;
/// a newer one (and one of the generation held) is.
#[tokio::test]
async fn an_older_key_set_after_a_newer_one_is_not_installed() {
    let (mut owner, views, handle) = owner();
    // (key, generation offered, installed, generation held after)
    let steps = [
        ("new", 5, true, 5),
        ("old", 4, false, 5),
        ("same", 5, true, 5),
        ("next", 6, true, 6),
    ];
    for (id, generation, installed, held) in steps {
        let asked = owner
            .serve_while(handle.set_keys(key_set(id, generation)))
            .await;
        assert_eq!(asked, Ok(installed), "{id}");
        let trust = views.trust.read();
        assert_eq!(trust.has_key(id), installed, "{id}");
        assert_eq!(trust.key_order(), (7, held), "{id}");
    }
    assert!(!views.trust.read().has_key("new"), "replaced by the next");
    assert_eq!(owner.tables.metrics.get("set_keys", "stale"), 1);
    assert_eq!(owner.tables.metrics.get("set_keys", "ok"), 3);
}

#[test]
fn the_stale_key_set_count_is_pre_created() {
    let mut registry = Registry::default();
    let _ = Owner::new(&mut registry, DEADLINE, 16);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    assert!(
        text.contains(
            "agentmesh_router_state_commands_total{command=\"set_keys\",result=\"stale\"} 0"
        ),
        "{text}"
    );
}

/// A record and its signed form for `peer` naming `services` (the store
/// does not verify: the catalog server did before asking).
fn record(peer: &PeerId, services: &[&str]) -> Publish {
    Publish {
        provider: *peer,
        signed: agentmesh_proto::pb::mesh::SignedRecord {
            record: peer.to_bytes(),
            signature: vec![],
        },
        record: agentmesh_proto::pb::mesh::ServiceRecord {
            provider: peer.to_bytes(),
            services: services.iter().map(|s| s.to_string()).collect(),
            expires_at_unix_secs: i64::MAX / 4,
            ..Default::default()
        },
        now: 1,
    }
}

/// The race a lock-per-writer store had: the server checked the member's
/// admission, the member left (the loop dropped its records), then the
/// server stored the record, which stayed until it expired. The owner
/// checks the admission at the write.
#[tokio::test]
async fn a_record_is_stored_only_for_a_member_still_admitted_when_the_owner_writes() {
    use crate::catalog::store::{RecordWriter as _, StoreError, WriteError};
    let (mut owner, views, handle) = owner();
    let (member, gone) = (PeerId::random(), PeerId::random());
    let asks = async {
        handle
            .admit(member, admission(Purpose::Attach), open())
            .await
            .expect("answered")
            .expect("admitted");
        let stored = handle.publish(record(&member, &["echo"])).await;
        let refused = handle.publish(record(&gone, &["echo"])).await;
        (stored, refused)
    };
    let (stored, refused) = owner.serve_while(asks).await;
    assert!(stored.is_ok(), "{stored:?}");
    assert_eq!(refused, Err(WriteError::Store(StoreError::NotAdmitted)));
    assert_eq!(views.catalog.read().lookup("echo", 1, 10).len(), 1);
    assert!(
        owner.tables.take_catalog_changed(),
        "the loop re-announces after a stored record"
    );
    assert!(!owner.tables.take_catalog_changed(), "once");
    owner
        .serve_while(handle.withdraw(member))
        .await
        .expect("withdrawn");
    assert!(views.catalog.read().lookup("echo", 1, 10).is_empty());
    assert!(owner.tables.take_catalog_changed());
    assert_eq!(owner.tables.metrics.get("publish", "ok"), 2);
    assert_eq!(owner.tables.metrics.get("withdraw", "ok"), 1);
}

#[tokio::test]
async fn a_policy_drops_records_with_the_trust_and_admissions_the_owner_holds() {
    let (mut owner, views, handle) = owner();
    let (keep, drop_me) = (PeerId::random(), PeerId::random());
    for p in [keep, drop_me] {
        owner
            .tables
            .admissions
            .write()
            .admit(p, admission(Purpose::Attach));
        let stored = owner.tables.publish(record(&p, &["echo"]));
        assert!(matches!(stored, Reply::Published(Ok(_))), "{stored:?}");
    }
    owner.tables.take_catalog_changed();
    let dropped = owner
        .serve_while(handle.drop_records(move |p, _, trust, admissions| {
            // The owner hands over the tables it holds.
            assert_eq!(trust.key_count(), 0);
            assert!(admissions.get(p).is_some());
            *p == keep
        }))
        .await;
    assert_eq!(dropped, Ok(1));
    let left: Vec<PeerId> = views
        .catalog
        .read()
        .lookup("echo", 1, 10)
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(left, vec![keep]);
    assert!(owner.tables.take_catalog_changed());
    // Nothing dropped: nothing to re-announce.
    let none = owner
        .serve_while(handle.drop_records(|_, _, _, _| true))
        .await;
    assert_eq!(none, Ok(0));
    assert!(!owner.tables.take_catalog_changed());
}
