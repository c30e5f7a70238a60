//! Serving one catalog stream.
//!
//! - publish: the peer must be admitted to attach; the record must verify,
//!   name the peer as provider and prove it owns every service it names
//!   under the policy held (`crate::policy::publish`).
//! - withdraw: drops the peer's record.
//!
//! The server never writes the store: it reads the swarm loop's store
//! through a view and asks the loop to write (`RecordWriter`), which
//! re-checks at the write that the publisher is still admitted.
//! - lookup (any admitted peer): own members' records, then the routers the
//!   DHT names as providers, asked with `local_lookup`; merged, verified,
//!   capped.
//! - local_lookup (admitted routers only): own members' records.
//! - upgraded (admitted members): a circuit through us was replaced by a
//!   direct connection; checked and counted in `super::upgraded`.

use std::collections::HashMap;
use std::sync::Arc;

use agentmesh_proto::pb::mesh::{Lookup, ServiceRecord, SignedRecord, catalog_request};
use agentmesh_proto::protocols::MAX_CATALOG_FRAME_BYTES;
use agentmesh_proto::record::verify_record;
use agentmesh_proto::unix_now;
use agentmesh_wire::catalog::{self as wire, CatalogAnswer};
use futures::stream::FuturesUnordered;
use futures::{AsyncWriteExt, StreamExt};
use libp2p::PeerId;
use prost::Message;
use tokio::sync::{mpsc, oneshot};

use super::store::{CatalogStore, Publish, RecordWriter, WriteError};
use super::{ProviderQuery, service_key};
use crate::admission::Admissions;
use crate::config::Config;
use crate::metrics::{Metrics, UNKNOWN_OP};
use crate::owned::View;

/// Provider routers asked per lookup at most.
const MAX_ROUTERS_PER_LOOKUP: usize = 8;

/// Room left in an answer frame for framing overhead.
const FRAME_SLACK_BYTES: usize = 1024;

/// The access policy's check of a published record (`policy::publish`):
/// `Ok`, or the reason the publisher is told (counted by the checker). A
/// trait so the catalog does not depend on the policy module, which drops
/// records from the catalog when ownership goes.
pub(crate) trait PublishCheck: Send + Sync {
    fn check(&self, record: &ServiceRecord, provider: &PeerId, now: i64) -> Result<(), String>;
}

/// What serving catalog streams needs.
#[derive(Clone)]
pub(crate) struct CatalogCtx {
    pub(crate) config: Arc<Config>,
    /// This router.
    pub(crate) me: PeerId,
    pub(crate) metrics: Metrics,
    pub(crate) admissions: Admissions,
    /// The records held (the swarm loop's store, read-only here).
    pub(crate) records: View<CatalogStore>,
    /// Asks the swarm loop to write the store.
    pub(crate) writer: Arc<dyn RecordWriter>,
    /// Provider searches, run by the swarm loop.
    pub(crate) providers: mpsc::Sender<ProviderQuery>,
    pub(crate) control: agentmesh_streams::Control,
    /// The policy's ownership check on published records.
    pub(crate) ownership: Arc<dyn PublishCheck>,
    /// The live circuits upgrade notices mark.
    pub(crate) upgrades: Arc<dyn super::upgraded::UpgradeMarks>,
}

/// Serves one catalog stream from `peer` (any byte stream: tests use a pipe).
pub(crate) async fn serve<S>(ctx: CatalogCtx, peer: PeerId, mut stream: S)
where
    S: futures::AsyncRead + futures::AsyncWrite + Unpin,
{
    let t = ctx.config.connections.stream_timeout;
    let req = match wire::read_request(&mut stream, t).await {
        Ok(r) => r,
        Err(e) => {
            if e.is_malformed() {
                ctx.metrics.catalog(UNKNOWN_OP, "malformed");
                let _ =
                    wire::write_refused(&mut stream, format!("malformed request: {e}"), t).await;
            }
            tracing::debug!(%peer, error = %e, "catalog request unreadable");
            return;
        }
    };
    let now = unix_now();
    let result = match req.op {
        Some(catalog_request::Op::Publish(signed)) => {
            let r = publish(&ctx, peer, signed, now).await;
            ctx.metrics.catalog("publish", result_label(&r));
            match r {
                Ok(exp) => wire::write_ack(&mut stream, exp, t).await,
                Err((_, reason)) => wire::write_refused(&mut stream, reason, t).await,
            }
        }
        Some(catalog_request::Op::Withdraw(_)) => match ctx.writer.withdraw(peer).await {
            Ok(()) => {
                ctx.metrics.catalog("withdraw", "ok");
                wire::write_ack(&mut stream, 0, t).await
            }
            Err(e) => {
                ctx.metrics.catalog("withdraw", "error");
                wire::write_refused(&mut stream, format!("withdraw not done: {e}"), t).await
            }
        },
        Some(catalog_request::Op::Lookup(l)) => {
            if !ctx.admissions.read().is_admitted(&peer, now) {
                ctx.metrics.catalog("lookup", "refused");
                wire::write_refused(&mut stream, "not admitted".into(), t).await
            } else {
                let (records, complete) = lookup(&ctx, &l).await;
                ctx.metrics
                    .catalog("lookup", if complete { "ok" } else { "partial" });
                wire::write_records(&mut stream, records, t).await
            }
        }
        Some(catalog_request::Op::LocalLookup(l)) => {
            if !ctx.admissions.read().is_router(&peer, now) {
                ctx.metrics.catalog("local_lookup", "refused");
                wire::write_refused(
                    &mut stream,
                    "local_lookup is for admitted routers".into(),
                    t,
                )
                .await
            } else {
                let records = local(&ctx, &l, now);
                ctx.metrics.catalog("local_lookup", "ok");
                wire::write_records(&mut stream, records, t).await
            }
        }
        Some(catalog_request::Op::Upgraded(u)) => {
            let r = super::upgraded::judge(
                ctx.upgrades.as_ref(),
                &ctx.admissions,
                &ctx.metrics,
                &peer,
                &u,
                now,
            );
            match r {
                Ok(()) => {
                    ctx.metrics.catalog("upgraded", "ok");
                    wire::write_ack(&mut stream, 0, t).await
                }
                Err((label, reason)) => {
                    let result = if label == "malformed" {
                        "malformed"
                    } else {
                        "refused"
                    };
                    ctx.metrics.catalog("upgraded", result);
                    wire::write_refused(&mut stream, reason, t).await
                }
            }
        }
        None => {
            ctx.metrics.catalog(UNKNOWN_OP, "malformed");
            wire::write_refused(&mut stream, "request names no operation".into(), t).await
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "catalog answer not delivered");
    }
    let _ = tokio::time::timeout(t, stream.close()).await;
}

fn result_label(r: &Result<i64, (&'static str, String)>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err((label, _)) => label,
    }
}

async fn publish(
    ctx: &CatalogCtx,
    peer: PeerId,
    signed: SignedRecord,
    now: i64,
) -> Result<i64, (&'static str, String)> {
    if !ctx.admissions.read().may_reserve(&peer, now) {
        return Err(("refused", "publish needs an admitted attach".into()));
    }
    let (record, provider) =
        verify_record(&signed, now).map_err(|e| ("malformed", format!("record refused: {e}")))?;
    if provider != peer {
        return Err(("refused", "record names another provider".into()));
    }
    ctx.ownership
        .check(&record, &provider, now)
        .map_err(|reason| ("refused", reason))?;
    let publish = Publish {
        provider: peer,
        signed,
        record,
        now,
    };
    ctx.writer.publish(publish).await.map_err(|e| match e {
        WriteError::Store(e) => ("refused", e.to_string()),
        WriteError::Unanswered(e) => ("error", format!("not stored, try again: {e}")),
    })
}

fn limit_of(ctx: &CatalogCtx, l: &Lookup) -> usize {
    let max = ctx.config.catalog.max_results;
    match l.limit {
        0 => max,
        n => (n as usize).min(max),
    }
}

fn local(ctx: &CatalogCtx, l: &Lookup, now: i64) -> Vec<SignedRecord> {
    let limit = limit_of(ctx, l);
    let records = ctx.records.read().lookup(&l.service, now, limit);
    cap_bytes(records.into_iter().map(|(_, r)| r).collect())
}

/// Keeps records while the answer fits one catalog frame.
fn cap_bytes(records: Vec<SignedRecord>) -> Vec<SignedRecord> {
    let mut total = 0usize;
    records
        .into_iter()
        .take_while(|r| {
            total += r.encoded_len() + 8;
            total <= MAX_CATALOG_FRAME_BYTES - FRAME_SLACK_BYTES
        })
        .collect()
}

/// Local records, then other routers' until `limit` or the remote budget
/// (`--catalog-remote-lookup-budget-ms`) runs out; returns the records and
/// whether every router that was to be asked answered in time.
async fn lookup(ctx: &CatalogCtx, l: &Lookup) -> (Vec<SignedRecord>, bool) {
    // One deadline for the whole remote phase (finding provider routers and
    // asking them), so no slow or dead router holds a lookup past the
    // member's own deadline.
    let deadline = tokio::time::Instant::now() + ctx.config.catalog.remote_lookup_budget;
    let limit = limit_of(ctx, l);
    let now = unix_now();
    // A zero budget means: answer from this router's own records only.
    let ask_others = !ctx.config.catalog.remote_lookup_budget.is_zero();
    let mut complete = ask_others;
    let mut found: HashMap<PeerId, SignedRecord> = HashMap::new();
    // Local records were verified when published.
    found.extend(ctx.records.read().lookup(&l.service, now, limit));
    if ask_others && found.len() < limit {
        let routers = providers(ctx, &l.service, deadline)
            .await
            .unwrap_or_else(|| {
                complete = false;
                Vec::new()
            });
        tracing::debug!(service = %l.service, ?routers, local = found.len(), "lookup: provider routers");
        let mut asks: FuturesUnordered<_> = routers
            .into_iter()
            .filter(|p| *p != ctx.me)
            .take(MAX_ROUTERS_PER_LOOKUP)
            .map(|p| ask_router(ctx.control.clone(), p, l.service.clone(), limit, deadline))
            .collect();
        loop {
            let records = match tokio::time::timeout_at(deadline, asks.next()).await {
                Ok(Some(Some(records))) => records,
                Ok(Some(None)) => {
                    complete = false;
                    continue;
                }
                Ok(None) => break,
                Err(_) => {
                    tracing::debug!(service = %l.service, left = asks.len(), "lookup: routers past the budget");
                    complete = false;
                    break;
                }
            };
            for r in records {
                let Ok((rec, p)) = verify_record(&r, now) else {
                    continue;
                };
                if rec.services.contains(&l.service) && found.len() < limit {
                    found.entry(p).or_insert(r);
                }
            }
        }
    }
    (
        cap_bytes(found.into_values().take(limit).collect()),
        complete,
    )
}

/// Routers providing `service` per the router DHT; `None` when the answer
/// did not come by `deadline`.
async fn providers(
    ctx: &CatalogCtx,
    service: &str,
    deadline: tokio::time::Instant,
) -> Option<Vec<PeerId>> {
    let (reply, rx) = oneshot::channel();
    let query = ProviderQuery {
        key: service_key(service),
        reply,
    };
    match tokio::time::timeout_at(deadline, ctx.providers.send(query)).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => return None,
        Err(_) => {
            // Members' lookups come at their rate: once a minute in all.
            if let Some(suppressed) = ctx.metrics.log.pass(&String::new(), "provider_query_late") {
                tracing::warn!(
                    suppressed,
                    "swarm command queue full; lookup answers locally (logged at most once a minute)"
                );
            }
            return None;
        }
    }
    tokio::time::timeout_at(deadline, rx).await.ok()?.ok()
}

/// One router's own records for `service`; `None` when it could not be
/// asked or did not answer by `deadline`.
async fn ask_router(
    control: agentmesh_streams::Control,
    router: PeerId,
    service: String,
    limit: usize,
    deadline: tokio::time::Instant,
) -> Option<Vec<SignedRecord>> {
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    let req = wire::local_lookup(&service, u32::try_from(limit).unwrap_or(u32::MAX));
    match wire::request(control, router, req, left).await {
        Ok(CatalogAnswer::Records(records)) => Some(records),
        Ok(CatalogAnswer::Refused(reason)) => {
            tracing::debug!(%router, %reason, "router refused local lookup");
            None
        }
        Ok(CatalogAnswer::Ack(_)) => {
            tracing::debug!(%router, "router acked a local lookup");
            None
        }
        Err(e) => {
            tracing::debug!(%router, error = %e, "local lookup failed");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use agentmesh_proto::pb::mesh::CatalogRequest;
    use futures::AsyncReadExt as _;
    use tokio_util::compat::TokioAsyncReadCompatExt as _;

    use super::*;

    /// Refuses every record: these tests never publish.
    struct RefuseAll;

    impl PublishCheck for RefuseAll {
        fn check(&self, _: &ServiceRecord, _: &PeerId, _: i64) -> Result<(), String> {
            Err("not_owner: no policy in this test".into())
        }
    }

    /// Answers every write unanswered: these tests never write.
    struct NoWrites;

    impl RecordWriter for NoWrites {
        fn publish(&self, _: Publish) -> futures::future::BoxFuture<'_, Result<i64, WriteError>> {
            Box::pin(async { Err(WriteError::Unanswered("no store in this test".into())) })
        }
        fn withdraw(&self, _: PeerId) -> futures::future::BoxFuture<'_, Result<(), WriteError>> {
            Box::pin(async { Err(WriteError::Unanswered("no store in this test".into())) })
        }
    }

    fn count(ctx: &CatalogCtx, op: &'static str) -> u64 {
        ctx.metrics
            .catalog
            .requests
            .get_or_create(&[("op", op), ("result", "malformed")])
            .get()
    }

    /// Serves `bytes` as one request; returns what the router answered.
    async fn serve_bytes(ctx: &CatalogCtx, bytes: Vec<u8>) -> Vec<u8> {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let served = tokio::spawn(serve(ctx.clone(), PeerId::random(), ours.compat()));
        let mut theirs = theirs.compat();
        futures::AsyncWriteExt::write_all(&mut theirs, &bytes)
            .await
            .expect("write");
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            theirs.read_to_end(&mut answer),
        )
        .await
        .expect("answered in time");
        served.await.expect("served");
        answer
    }

    #[tokio::test]
    async fn requests_without_an_operation_count_as_unknown_not_publish() {
        let config = Config::default();
        let ctx = CatalogCtx {
            records: crate::owned::Owned::new(CatalogStore::new(1)).view(),
            writer: Arc::new(NoWrites),
            config: Arc::new(config),
            me: PeerId::random(),
            metrics: Metrics::new(&mut prometheus_client::registry::Registry::default()),
            admissions: Admissions::default(),
            providers: mpsc::channel(1).0,
            control: agentmesh_streams::Behaviour::new().new_control(),
            ownership: Arc::new(RefuseAll),
            upgrades: Arc::new(crate::resources::circuits::LiveCircuits::default()),
        };
        assert_eq!(count(&ctx, UNKNOWN_OP), 0, "pre-created at 0");
        // A length prefix past the frame limit: unreadable.
        let answer = serve_bytes(&ctx, vec![0xff, 0xff, 0xff, 0xff, 0x0f]).await;
        assert!(!answer.is_empty(), "the peer is told why");
        assert_eq!(count(&ctx, UNKNOWN_OP), 1);
        // A well-formed request that names no operation.
        let mut frame = Vec::new();
        CatalogRequest { op: None }
            .encode_length_delimited(&mut frame)
            .expect("encode");
        serve_bytes(&ctx, frame).await;
        assert_eq!(count(&ctx, UNKNOWN_OP), 2);
        assert_eq!(count(&ctx, "publish"), 0, "no publish was sent");
    }
}
