//! Upgrade notices served end to end on a byte pipe: the real catalog
//! server, the real live-circuit registry and admission table; each
//! attack a lying member could make is refused and counted by reason.

use std::sync::Arc;
use std::time::Duration;

use agentmesh_proto::pb::mesh::{CatalogRequest, ServiceRecord, Upgraded, catalog_request};
use agentmesh_wire::catalog::{self as wire, CatalogAnswer};
use futures::AsyncReadExt as _;
use libp2p::PeerId;
use prost::Message as _;
use tokio::sync::mpsc;
use tokio_util::compat::TokioAsyncReadCompatExt as _;

use crate::admission::{Admission, AdmissionTable, Purpose};
use crate::catalog::server::{CatalogCtx, PublishCheck, serve};
use crate::catalog::store::{CatalogStore, Publish, RecordWriter, WriteError};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::owned::Owned;
use crate::resources::circuits::LiveCircuits;

/// These tests publish nothing.
struct NoPublish;

impl PublishCheck for NoPublish {
    fn check(&self, _: &ServiceRecord, _: &PeerId, _: i64) -> Result<(), String> {
        Err("no publishing in this test".into())
    }
}

impl RecordWriter for NoPublish {
    fn publish(&self, _: Publish) -> futures::future::BoxFuture<'_, Result<i64, WriteError>> {
        Box::pin(async { Err(WriteError::Unanswered("no store in this test".into())) })
    }
    fn withdraw(&self, _: PeerId) -> futures::future::BoxFuture<'_, Result<(), WriteError>> {
        Box::pin(async { Err(WriteError::Unanswered("no store in this test".into())) })
    }
}

struct Router {
    ctx: CatalogCtx,
    circuits: Arc<LiveCircuits>,
    /// Kept so the admission table has its one writer.
    _table: Owned<AdmissionTable>,
}

fn router(admitted: &[PeerId]) -> Router {
    let mut table = Owned::new(AdmissionTable::default());
    for p in admitted {
        table.write().admit(
            *p,
            Admission {
                purpose: Purpose::Attach,
                until: i64::MAX / 2,
                node_id: "test".into(),
                attached_routers: vec![],
                groups: None,
                push: Default::default(),
            },
        );
    }
    let circuits = Arc::new(LiveCircuits::default());
    let ctx = CatalogCtx {
        config: Arc::new(Config::default()),
        me: PeerId::random(),
        metrics: Metrics::new(&mut prometheus_client::registry::Registry::default()),
        admissions: table.view(),
        records: Owned::new(CatalogStore::new(1)).view(),
        writer: Arc::new(NoPublish),
        providers: mpsc::channel(1).0,
        control: agentmesh_streams::Behaviour::new().new_control(),
        ownership: Arc::new(NoPublish),
        upgrades: circuits.clone(),
    };
    Router {
        ctx,
        circuits,
        _table: table,
    }
}

impl Router {
    fn upgraded(&self) -> u64 {
        self.ctx.metrics.relay.circuits_upgraded.get()
    }

    fn refused(&self, reason: &'static str) -> u64 {
        self.ctx
            .metrics
            .relay
            .upgrade_notices_refused
            .get_or_create(&[("reason", reason)])
            .get()
    }

    /// Serves `bytes` from `member` on one stream; returns the answer,
    /// after the server closed the stream.
    async fn serve(&self, member: PeerId, bytes: Vec<u8>) -> Option<CatalogAnswer> {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let served = tokio::spawn(serve(self.ctx.clone(), member, ours.compat()));
        let mut theirs = theirs.compat();
        futures::AsyncWriteExt::write_all(&mut theirs, &bytes)
            .await
            .expect("write");
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), theirs.read_to_end(&mut answer))
            .await
            .expect("the server closes the stream")
            .expect("read");
        served.await.expect("served");
        wire::decode_response(&answer).expect("one answer frame")
    }

    async fn notice(&self, member: PeerId, peer: PeerId) -> Option<CatalogAnswer> {
        self.serve(member, frame(&wire::upgraded(&peer))).await
    }
}

fn frame(req: &CatalogRequest) -> Vec<u8> {
    let mut bytes = Vec::new();
    req.encode_length_delimited(&mut bytes).expect("encode");
    bytes
}

fn refused(a: Option<CatalogAnswer>) -> bool {
    matches!(a, Some(CatalogAnswer::Refused(_)))
}

#[test]
fn the_counters_exist_at_zero_every_reason_pre_created() {
    let mut reg = prometheus_client::registry::Registry::default();
    let _m = Metrics::new(&mut reg);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &reg).expect("encode");
    assert!(text.contains("agentmesh_router_circuits_upgraded_total 0"));
    for reason in crate::metrics::UPGRADE_REFUSALS {
        let line =
            format!("agentmesh_router_upgrade_notices_refused_total{{reason=\"{reason}\"}} 0");
        assert!(text.contains(&line), "{line} missing");
    }
}

#[tokio::test]
async fn a_member_counts_its_own_live_circuit_once() {
    let (a, b) = (PeerId::random(), PeerId::random());
    let r = router(&[a, b]);
    let ab = r.circuits.register(a, b);
    assert_eq!(r.notice(a, b).await, Some(CatalogAnswer::Ack(0)));
    assert_eq!(r.upgraded(), 1);
    // The same circuit again, from either end: a duplicate, not counted.
    assert!(refused(r.notice(a, b).await));
    assert!(refused(r.notice(b, a).await));
    assert_eq!((r.upgraded(), r.refused("duplicate")), (1, 2));
    r.circuits.release(ab.id);
}

#[tokio::test]
async fn a_member_naming_another_members_circuit_marks_nothing() {
    let (a, b, liar) = (PeerId::random(), PeerId::random(), PeerId::random());
    let r = router(&[a, b, liar]);
    let _ab = r.circuits.register(a, b);
    // The liar names each end of a circuit it is not on.
    assert!(refused(r.notice(liar, a).await));
    assert!(refused(r.notice(liar, b).await));
    assert_eq!((r.upgraded(), r.refused("no_such_circuit")), (0, 2));
    // The circuit is still there to be counted by its own member.
    assert_eq!(r.notice(b, a).await, Some(CatalogAnswer::Ack(0)));
    assert_eq!(r.upgraded(), 1);
}

#[tokio::test]
async fn a_circuit_that_does_not_exist_or_is_gone_marks_nothing() {
    let (a, b) = (PeerId::random(), PeerId::random());
    let r = router(&[a, b]);
    assert!(refused(r.notice(a, b).await));
    let ab = r.circuits.register(a, b);
    r.circuits.release(ab.id);
    assert!(
        refused(r.notice(a, b).await),
        "a closed circuit is no circuit"
    );
    assert_eq!((r.upgraded(), r.refused("no_such_circuit")), (0, 2));
}

#[tokio::test]
async fn a_peer_no_longer_admitted_marks_nothing() {
    let (a, b) = (PeerId::random(), PeerId::random());
    let r = router(&[b]);
    let _ab = r.circuits.register(a, b);
    assert!(refused(r.notice(a, b).await));
    assert_eq!((r.upgraded(), r.refused("not_admitted")), (0, 1));
}

#[tokio::test]
async fn malformed_notices_close_their_stream_counted() {
    let (a, b) = (PeerId::random(), PeerId::random());
    let r = router(&[a, b]);
    let _ab = r.circuits.register(a, b);
    // A notice whose peer is not a PeerId.
    let bad_peer = CatalogRequest {
        op: Some(catalog_request::Op::Upgraded(Upgraded {
            peer: vec![0xff; 9],
        })),
    };
    assert!(refused(r.serve(a, frame(&bad_peer)).await));
    assert_eq!(r.refused("malformed"), 1);
    // Bytes that are no frame at all: refused as the catalog's unknown op.
    assert!(refused(
        r.serve(a, vec![0xff, 0xff, 0xff, 0xff, 0x0f]).await
    ));
    let unknown = r
        .ctx
        .metrics
        .catalog
        .requests
        .get_or_create(&[("op", crate::metrics::UNKNOWN_OP), ("result", "malformed")])
        .get();
    assert_eq!(unknown, 1);
    assert_eq!(r.upgraded(), 0, "nothing was marked");
    // The circuit is still there for a well-formed notice.
    assert_eq!(r.notice(a, b).await, Some(CatalogAnswer::Ack(0)));
}
