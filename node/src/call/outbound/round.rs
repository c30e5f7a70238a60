//! One round of a call: the routers a call may use now, one lookup of
//! the service through them, the providers whose records prove they own
//! it (newest record per provider, never us), and up to `call_attempts`
//! of them tried in order.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use agentmesh_proto::credential::{CredentialError, Trust};
use agentmesh_proto::enforce::OwnershipError;
use agentmesh_proto::pb::mesh::{LookupResult, ServiceRecord};
use agentmesh_proto::record::verify_record;
use agentmesh_proto::unix_now;
use agentmesh_wire::catalog::{self, CatalogAnswer};
use libp2p::{Multiaddr, PeerId};
use rand::seq::SliceRandom as _;
use tokio::time::Instant;

use super::Budget;
use super::attempt::{Route, attempt};
use super::failure::{AttemptError, RouteFailure};
use crate::call::{CallError, CallStream};
use crate::command::{Routes, Unanswered};
use crate::node::Node;

/// Most provider records asked for in one lookup.
const LOOKUP_LIMIT: u32 = 32;

/// A failed round: the error for the caller, and the route failures of
/// its attempts when the last attempt's failure was one (a retry may help).
pub(super) struct RoundError {
    pub(super) error: CallError,
    pub(super) routes: Vec<RouteFailure>,
}

impl From<CallError> for RoundError {
    fn from(error: CallError) -> Self {
        Self {
            error,
            routes: Vec::new(),
        }
    }
}

/// What a round may try: providers in order of preference with the
/// routers their records name, and our routers' addresses.
struct Candidates {
    providers: Vec<(PeerId, Vec<PeerId>)>,
    attached: HashMap<PeerId, Multiaddr>,
}

/// One lookup and up to `call_attempts` providers, routes through routers
/// in `avoid` (and routers of ours that are leaving) last. On a `retry`,
/// relayed connections to a provider through routers it no longer lists
/// (or in `avoid`) are closed before the new circuit.
pub(super) async fn round(
    node: &Arc<Node>,
    service: &str,
    avoid: &HashSet<PeerId>,
    retry: bool,
    (close_all, suspect): (bool, Option<libp2p::swarm::ConnectionId>),
    intent: super::Intent,
    budget: Budget,
) -> Result<CallStream, RoundError> {
    let view = node
        .routes(budget.cap(node.config.connect_timeout()))
        .await
        .map_err(|e| match e {
            Unanswered::Stopping => CallError::ShuttingDown,
            e @ Unanswered::TimedOut(_) => CallError::LookupFailed {
                service: service.to_string(),
                detail: e.to_string(),
            },
        })?;
    let mut avoid = avoid.clone();
    avoid.extend(view.leaving.iter().copied());
    let found = candidates(node, service, &view, &avoid, budget).await?;
    let route = Route {
        attached: &found.attached,
        directory: &view.directory,
        avoid: &avoid,
        retry,
        close_all,
        suspect,
        intent,
        budget,
    };
    let attempts = node.config.calls.attempts.max(1);
    let mut last = None;
    let mut routes = Vec::new();
    let mut tried = 0;
    for (provider, routers) in found.providers.into_iter().take(attempts) {
        if tried > 0 && budget.spent() {
            break;
        }
        tried += 1;
        match attempt(node, service, provider, &routers, route).await {
            Ok(s) => return Ok(s),
            Err(AttemptError::Denied { detail }) => {
                // A policy refusal: every provider and router would say
                // the same to this caller for this service.
                tracing::debug!(%provider, service, error = %detail, "circuit refused by policy");
                return Err(CallError::Denied {
                    service: service.to_string(),
                    detail,
                }
                .into());
            }
            Err(e) => {
                tracing::debug!(%provider, service, error = %e, "provider attempt failed");
                routes.extend(e.route());
                last = Some(e);
            }
        }
    }
    let last = last.unwrap_or(AttemptError::NoAttempt);
    if last.route().is_none() {
        // The last failure was not the route's: no retry.
        routes.clear();
    }
    Err(RoundError {
        error: CallError::Failed {
            service: service.to_string(),
            attempts: tried,
            last: last.to_string(),
            refused: last.refused(),
            refusal: last.refusal(),
            timed_out: last.timed_out(),
        },
        routes,
    })
}

/// The providers of `service` a round may try, in order: a lookup through
/// our routers (avoided ones last), the records verified and proving
/// ownership, newest per provider, shuffled, those sharing one of our
/// routers (not avoided) first.
async fn candidates(
    node: &Arc<Node>,
    service: &str,
    view: &Routes,
    avoid: &HashSet<PeerId>,
    budget: Budget,
) -> Result<Candidates, CallError> {
    let mut attached = view.attached.clone();
    if attached.is_empty() {
        let why = node.status.borrow().readyz_line();
        return Err(CallError::NotReady(why.trim_end().to_string()));
    }
    attached.shuffle(&mut rand::thread_rng());
    attached.sort_by_key(|(r, _)| avoid.contains(r));
    let found = lookup(node, service, &attached, budget).await?;

    // Verified records naming the service that prove their provider owns
    // it, newest per provider, never us.
    let now = unix_now();
    let mut verified = Vec::new();
    for signed in &found.records {
        let Ok((record, provider)) = verify_record(signed, now) else {
            continue;
        };
        if provider == node.peer_id || !record.services.iter().any(|s| s == service) {
            continue;
        }
        verified.push((record, provider));
    }
    let owned = owners(node, verified, now).await;
    let mut by_provider: HashMap<PeerId, (i64, Vec<PeerId>)> = HashMap::new();
    for (record, provider) in owned {
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
    node.seen
        .looked_up(service, by_provider.len(), Instant::now());
    let attached: HashMap<PeerId, Multiaddr> = attached.into_iter().collect();
    let mut providers: Vec<(PeerId, Vec<PeerId>)> =
        by_provider.into_iter().map(|(p, (_, r))| (p, r)).collect();
    if providers.is_empty() {
        return Err(CallError::NoProviders(service.to_string()));
    }
    providers.shuffle(&mut rand::thread_rng());
    // Providers sharing one of our routers (not avoided) first (stable:
    // keeps the shuffle).
    providers.sort_by_key(|(_, routers)| {
        !routers
            .iter()
            .any(|r| attached.contains_key(r) && !avoid.contains(r))
    });
    Ok(Candidates {
        providers,
        attached,
    })
}

/// Asks our routers, in order, who provides `service`.
async fn lookup(
    node: &Arc<Node>,
    service: &str,
    attached: &[(PeerId, Multiaddr)],
    budget: Budget,
) -> Result<LookupResult, CallError> {
    // `attached` is in order of preference. An empty answer may be one
    // router's stale view (a provider just moved): the next router is asked
    // too before nobody is taken to provide the service.
    let mut last = String::from("no router answered");
    let mut empty = None;
    for (router, _) in attached {
        if budget.spent() {
            last = format!("{last}; the call's budget ran out before asking {router}");
            break;
        }
        match catalog::request(
            node.control.clone(),
            *router,
            catalog::lookup(service, LOOKUP_LIMIT),
            budget.cap(node.config.call_timeout()),
        )
        .await
        {
            Ok(CatalogAnswer::Records(records)) if records.is_empty() => {
                empty = Some(LookupResult { records })
            }
            Ok(CatalogAnswer::Records(records)) => return Ok(LookupResult { records }),
            Ok(CatalogAnswer::Refused(reason)) => last = format!("router {router}: {reason}"),
            Ok(CatalogAnswer::Ack(_)) => {
                last = format!("router {router}: unexpected catalog answer")
            }
            Err(e) => last = e.to_string(),
        }
    }
    if let Some(found) = empty {
        return Ok(found);
    }
    Err(CallError::LookupFailed {
        service: service.to_string(),
        detail: last,
    })
}

/// The records among `verified` whose provider proves, with the
/// credential in the record, that the policy in force lets it provide what
/// the record names (`check_ownership`); the others are skipped and
/// counted by reason, so an impostor never receives a byte. A credential
/// signed by a key we do not know yet re-fetches the keys once (rate
/// limited) and is checked again.
async fn owners(
    node: &Node,
    verified: Vec<(ServiceRecord, PeerId)>,
    now: i64,
) -> Vec<(ServiceRecord, PeerId)> {
    let skew = node.config.control_plane.credential_skew.as_secs() as i64;
    let check = |record: &ServiceRecord, provider: &PeerId, trust: &Trust| {
        node.policy.check_record(record, provider, trust, now, skew)
    };
    let trust = node.trust();
    let unknown_key = |r: &Result<(), OwnershipError>| {
        matches!(
            r,
            Err(OwnershipError::Credential(CredentialError::UnknownKey(_)))
        )
    };
    let first: Vec<_> = verified
        .into_iter()
        .map(|(record, provider)| {
            let r = check(&record, &provider, &trust);
            (record, provider, r)
        })
        .collect();
    let retry = first.iter().any(|(_, _, r)| unknown_key(r)) && node.refetch_keys().await;
    let trust = node.trust();
    first
        .into_iter()
        .filter_map(|(record, provider, r)| {
            let r = if retry && unknown_key(&r) {
                check(&record, &provider, &trust)
            } else {
                r
            };
            match r {
                Ok(()) => Some((record, provider)),
                Err(e) => {
                    tracing::debug!(%provider, reason = e.reason(), error = %e, "provider skipped: its record does not prove ownership");
                    None
                }
            }
        })
        .collect()
}
