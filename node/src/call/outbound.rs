//! Outbound calls: look the service up through one of our routers, prefer a
//! provider sharing one of our routers (circuit through it), else open a
//! transit connection to one of the provider's routers; connect and call
//! timeouts; fall back to the next provider.

use std::collections::HashMap;
use std::sync::Arc;

use agentmesh_proto::pb::mesh::{
    CallRefusal, CatalogRequest, CatalogResponse, Lookup, LookupResult, Purpose, catalog_request,
    catalog_response,
};
use agentmesh_proto::record::verify_record;
use agentmesh_proto::unix_now;
use libp2p::core::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};
use rand::seq::SliceRandom as _;

use super::{CallError, CallRoute, CallStream};
use crate::core::router_base;
use crate::metrics::DirectionLabel;
use crate::shared::Shared;
use crate::wire::{self, AuthOutcome, WireError};

/// Most provider records asked for in one lookup.
const LOOKUP_LIMIT: u32 = 32;

/// One failed attempt at one provider.
struct AttemptError {
    detail: String,
    refused: bool,
    timed_out: bool,
}

impl From<WireError> for AttemptError {
    fn from(e: WireError) -> Self {
        Self {
            timed_out: matches!(e, WireError::Timeout { .. }),
            detail: e.to_string(),
            refused: false,
        }
    }
}

fn connect_error(detail: String) -> AttemptError {
    AttemptError {
        timed_out: detail.contains("within"),
        detail,
        refused: false,
    }
}

/// Calls `service`, counting the result.
pub(crate) async fn call(shared: &Arc<Shared>, service: &str) -> Result<CallStream, CallError> {
    let r = call_inner(shared, service).await;
    let label = match &r {
        Ok(_) => "ok",
        Err(e) => e.result_label(),
    };
    shared.metrics.call("outbound", label);
    if let Err(e) = &r {
        tracing::debug!(service, error = %e, "call failed");
    }
    r
}

async fn lookup(
    shared: &Arc<Shared>,
    service: &str,
    attached: &[(PeerId, Multiaddr)],
) -> Result<LookupResult, CallError> {
    let mut last = String::from("no router answered");
    for (router, _) in attached {
        let req = CatalogRequest {
            op: Some(catalog_request::Op::Lookup(Lookup {
                service: service.to_string(),
                limit: LOOKUP_LIMIT,
            })),
        };
        match wire::catalog(
            shared.control.clone(),
            *router,
            req,
            shared.config.call_timeout(),
        )
        .await
        {
            Ok(CatalogResponse {
                result: Some(catalog_response::Result::Providers(found)),
            }) => return Ok(found),
            Ok(CatalogResponse {
                result: Some(catalog_response::Result::Error(e)),
            }) => last = format!("router {router}: {}", e.reason),
            Ok(_) => last = format!("router {router}: unexpected catalog answer"),
            Err(e) => last = e.to_string(),
        }
    }
    Err(CallError::LookupFailed {
        service: service.to_string(),
        detail: last,
    })
}

async fn call_inner(shared: &Arc<Shared>, service: &str) -> Result<CallStream, CallError> {
    if shared.is_shutting_down() {
        return Err(CallError::ShuttingDown);
    }
    let mut attached: Vec<(PeerId, Multiaddr)> = shared
        .attached
        .read()
        .iter()
        .map(|(p, a)| (*p, a.clone()))
        .collect();
    if attached.is_empty() {
        return Err(CallError::NotReady);
    }
    attached.shuffle(&mut rand::thread_rng());
    let found = lookup(shared, service, &attached).await?;

    // Verified records naming the service, newest per provider, never us.
    let now = unix_now();
    let mut by_provider: HashMap<PeerId, (i64, Vec<PeerId>)> = HashMap::new();
    for signed in &found.records {
        let Ok((record, provider)) = verify_record(signed, now) else {
            continue;
        };
        if provider == shared.peer_id || !record.services.iter().any(|s| s == service) {
            continue;
        }
        let routers: Vec<PeerId> = record
            .routers
            .iter()
            .filter_map(|b| PeerId::from_bytes(b).ok())
            .collect();
        let e = by_provider
            .entry(provider)
            .or_insert((i64::MIN, Vec::new()));
        if record.issued_at_unix_secs > e.0 {
            *e = (record.issued_at_unix_secs, routers);
        }
    }
    let attached_map: HashMap<PeerId, Multiaddr> = attached.into_iter().collect();
    let mut providers: Vec<(PeerId, Vec<PeerId>)> =
        by_provider.into_iter().map(|(p, (_, r))| (p, r)).collect();
    if providers.is_empty() {
        return Err(CallError::NoProviders(service.to_string()));
    }
    providers.shuffle(&mut rand::thread_rng());
    // Providers sharing one of our routers first (stable: keeps the shuffle).
    providers.sort_by_key(|(_, routers)| !routers.iter().any(|r| attached_map.contains_key(r)));

    let attempts = shared.config.call_attempts.max(1);
    let mut last = None;
    let mut tried = 0;
    for (provider, routers) in providers.into_iter().take(attempts) {
        tried += 1;
        match attempt(shared, service, provider, &routers, &attached_map).await {
            Ok(s) => return Ok(s),
            Err(e) => {
                tracing::debug!(%provider, service, error = %e.detail, "provider attempt failed");
                last = Some(e);
            }
        }
    }
    let last = last.unwrap_or(AttemptError {
        detail: "no attempt made".into(),
        refused: false,
        timed_out: false,
    });
    Err(CallError::Failed {
        service: service.to_string(),
        attempts: tried,
        last: last.detail,
        refused: last.refused,
        timed_out: last.timed_out,
    })
}

/// Becomes admitted for transit at `router` (reusing an earlier admission
/// on the same connection).
async fn transit(
    shared: &Arc<Shared>,
    router: PeerId,
    addrs: Vec<Multiaddr>,
) -> Result<(), AttemptError> {
    shared.connect(router, addrs).await.map_err(connect_error)?;
    // A router we hold (or are acquiring) admits us for attach; a transit
    // auth would replace that admission and cost us the reservation.
    if shared.transit_admitted.lock().contains(&router) || shared.held.read().contains(&router) {
        return Ok(());
    }
    let attached: Vec<PeerId> = shared.attached.read().keys().copied().collect();
    match wire::auth(
        shared.control.clone(),
        router,
        shared.credential(),
        Purpose::Transit,
        attached,
        shared.config.call_timeout(),
    )
    .await?
    {
        AuthOutcome::Admitted(_) => {
            shared.transit_admitted.lock().insert(router);
            Ok(())
        }
        other => Err(connect_error(format!(
            "router {router} refused transit: {other:?}"
        ))),
    }
}

async fn attempt(
    shared: &Arc<Shared>,
    service: &str,
    provider: PeerId,
    routers: &[PeerId],
    attached: &HashMap<PeerId, Multiaddr>,
) -> Result<CallStream, AttemptError> {
    let (via, addr, is_transit) = if let Some(r) = routers.iter().find(|r| attached.contains_key(r))
    {
        (*r, attached[r].clone(), false)
    } else {
        let known: Vec<(PeerId, Vec<Multiaddr>)> = {
            let dir = shared.router_addrs.read();
            routers
                .iter()
                .filter_map(|r| dir.get(r).map(|a| (*r, a.clone())))
                .collect()
        };
        let Some((t, addrs)) = known.choose(&mut rand::thread_rng()).cloned() else {
            return Err(connect_error(format!(
                "none of provider {provider}'s {} routers is in our directory",
                routers.len()
            )));
        };
        transit(shared, t, addrs.clone()).await?;
        (t, addrs[0].clone(), true)
    };
    let circuit = router_base(&addr, via)
        .with(Protocol::P2pCircuit)
        .with(Protocol::P2p(provider));
    shared
        .connect(provider, vec![circuit])
        .await
        .map_err(connect_error)?;
    let (resp, stream) = wire::call(
        shared.control.clone(),
        provider,
        service,
        shared.credential(),
        shared.config.call_timeout(),
    )
    .await?;
    if !resp.accepted {
        let refusal = CallRefusal::try_from(resp.refusal).unwrap_or(CallRefusal::Unspecified);
        return Err(AttemptError {
            detail: format!(
                "provider {provider} refused: {} {}",
                refusal.as_str_name(),
                resp.detail
            ),
            refused: true,
            timed_out: false,
        });
    }
    let m = &shared.metrics;
    Ok(CallStream::new(
        stream,
        CallRoute {
            provider,
            via_router: via,
            transit: is_transit,
        },
        m.call_bytes
            .get_or_create(&DirectionLabel { direction: "sent" })
            .clone(),
        m.call_bytes
            .get_or_create(&DirectionLabel {
                direction: "received",
            })
            .clone(),
        shared.in_flight_guard(),
    ))
}
