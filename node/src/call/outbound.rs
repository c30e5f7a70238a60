//! Outbound calls: look the service up through one of our routers, prefer a
//! provider sharing one of our routers (circuit through it), else open a
//! transit connection to one of the provider's routers; connect and call
//! timeouts; fall back to the next provider.
//!
//! A call has one deadline, set when it starts: its budget, connect +
//! call timeout ([`crate::Config::call_budget`]). Every step (each router
//! asked in the lookup, each transit connect and auth, each relayed
//! connect, each call exchange, the pauses) waits at most its own timeout
//! cut to what is left of the budget, and the whole call is bounded by the
//! deadline too, so `call()` returns (a stream or an error) within its
//! budget however many routers, providers and retries it goes through.
//! Before, only the retry was held to the deadline: a first round trying
//! `--call-attempts` providers gave each step its full timeout, one after
//! the other, and could run for several budgets (seen as calls that had
//! not returned after 22 s while a router drained under 10,000 members).
//!
//! A route can fail under a call when a router drains or a provider moves
//! off it (circuit or connection closed, stream reset, the relayed dial's
//! oneshot canceled, no answer at all), and a relay denies a circuit at
//! once when the provider has too many circuits being set up through it
//! (the router's STOP handshake cap). Such a failure, when it was the
//! last, is retried up to [`MAX_ROUTE_RETRIES`] times: a fresh lookup,
//! routes avoiding the routers that failed, after a pause that grows and is
//! jittered, all within the call's deadline. Never after a provider
//! answered: an answer (accepted or refused) is final, and so is a router's
//! refusal of the circuit by its access policy (the relay's
//! PERMISSION_DENIED): no other provider or router is tried, and the error
//! says why with the node's own copy of the policy (`super::refusal`). A lookup where every router
//! asked knew no provider is asked once more too (once, apart from the
//! route retry), after a short pause: mid-move that is a gap in the catalog.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use agentmesh_proto::credential::{CredentialError, Trust};
use agentmesh_proto::enforce::OwnershipError;
use agentmesh_proto::pb::mesh::LookupResult;
use agentmesh_proto::pb::mesh::ServiceRecord;
use agentmesh_proto::record::verify_record;
use agentmesh_proto::unix_now;
use libp2p::core::multiaddr::Protocol;
use libp2p::{Multiaddr, PeerId};
use rand::Rng as _;
use rand::seq::SliceRandom as _;
use tokio::time::Instant;

use super::{CallError, CallRoute, CallStream};
use crate::engine::router_base;
use crate::metrics::DirectionLabel;
use crate::node::{Command, Node, TransitError, Unanswered};
use agentmesh_wire::ExchangeFailure;
use agentmesh_wire::call::{self as call_wire, CallAnswer};
use agentmesh_wire::catalog::{self, CatalogAnswer};

/// Most provider records asked for in one lookup.
const LOOKUP_LIMIT: u32 = 32;

/// Least time left of the call's deadline for a retry to be worth it.
const MIN_RETRY_TIME: Duration = Duration::from_secs(1);

/// Pause before the first route retry (jittered up to ×3, ×4 for each
/// retry after it): lets the failed circuit or connection finish closing,
/// so the retry does not reuse it, and spreads callers denied together.
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// Route retries of one call at most (within its deadline): 50, 200 and
/// 800 ms base pauses, so a storm of denied circuits is not retried at once
/// and the call still ends well inside its budget.
const MAX_ROUTE_RETRIES: u32 = 3;

/// Pause before asking again after no router knew a provider (jittered up
/// to ×3): time for a moving provider's record to reach its new router.
const NO_PROVIDERS_PAUSE: Duration = Duration::from_millis(250);

/// The deadline of one call: every step waits at most its own timeout cut
/// to what is left.
#[derive(Debug, Clone, Copy)]
struct Budget {
    deadline: Instant,
}

impl Budget {
    /// What a step may wait: `step`, or less when less is left.
    fn cap(&self, step: Duration) -> Duration {
        step.min(self.deadline.saturating_duration_since(Instant::now()))
    }

    /// Whether the deadline has passed.
    fn spent(&self) -> bool {
        Instant::now() >= self.deadline
    }
}

/// How a failure happened on the route to a provider (before it answered).
#[derive(Debug, Clone, Copy)]
struct RouteFailure {
    /// A [`crate::metrics::CALL_RETRY_REASONS`] value.
    reason: &'static str,
    /// The router the route went through.
    via: PeerId,
}

/// One failed attempt at one provider.
struct AttemptError {
    detail: String,
    refused: bool,
    timed_out: bool,
    /// Set when the route failed (not the provider, not a timeout).
    route: Option<RouteFailure>,
    /// The router refused the circuit by its access policy: final.
    denied: bool,
}

impl AttemptError {
    /// A failure on the wire: a route failure through `via` when the
    /// connection or stream failed (see [`ExchangeFailure::is_connection_failure`])
    /// or no answer came (a circuit that died without a reset).
    fn wire(e: impl ExchangeFailure, reason: &'static str, via: PeerId) -> Self {
        let timed_out = e.is_timeout();
        Self {
            timed_out,
            route: (timed_out || e.is_connection_failure()).then_some(RouteFailure { reason, via }),
            detail: e.to_string(),
            refused: false,
            denied: false,
        }
    }
}

/// A failure to connect (see `Node::connect`): a route failure through
/// `via` unless it timed out or the node is stopping.
fn connect_error(detail: String, via: PeerId) -> AttemptError {
    let timed_out = detail.contains("within");
    let route = (!timed_out && !detail.contains("node is stopping")).then_some(RouteFailure {
        reason: "connect_failed",
        via,
    });
    AttemptError {
        timed_out,
        detail,
        refused: false,
        route,
        denied: false,
    }
}

/// A failure that is not the route's: no provider could be tried, a refusal.
fn other_error(detail: String) -> AttemptError {
    AttemptError {
        detail,
        refused: false,
        timed_out: false,
        route: None,
        denied: false,
    }
}

/// Calls `service`, counting the result.
pub(crate) async fn call(node: &Arc<Node>, service: &str) -> Result<CallStream, CallError> {
    let r = call_inner(node, service).await;
    let label = match &r {
        Ok(_) => "ok",
        Err(e) => e.result_label(),
    };
    node.metrics.call("outbound", label);
    if let Err(e) = &r {
        tracing::debug!(service, error = %e, "call failed");
    }
    r
}

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

/// A failed round: the error for the caller, and the route failures of
/// its attempts when the last attempt's failure was one (a retry may help).
struct RoundError {
    error: CallError,
    routes: Vec<RouteFailure>,
}

impl From<CallError> for RoundError {
    fn from(error: CallError) -> Self {
        Self {
            error,
            routes: Vec::new(),
        }
    }
}

async fn call_inner(node: &Arc<Node>, service: &str) -> Result<CallStream, CallError> {
    if node.is_shutting_down() {
        return Err(CallError::ShuttingDown);
    }
    let limit = node.config.call_budget();
    let budget = Budget {
        deadline: Instant::now() + limit,
    };
    // Every step inside is cut to the deadline; this bounds what is not
    // (the command queue to the engine, anything added later).
    match tokio::time::timeout_at(budget.deadline, rounds(node, service, budget)).await {
        Ok(r) => r,
        Err(_) => Err(CallError::Failed {
            service: service.to_string(),
            attempts: 0,
            last: format!("the call's budget of {limit:?} (connect + call timeout) ran out"),
            refused: false,
            timed_out: true,
        }),
    }
}

/// A first round, up to [`MAX_ROUTE_RETRIES`] route retries and one retry
/// after an empty lookup, all by `budget`.
async fn rounds(node: &Arc<Node>, service: &str, budget: Budget) -> Result<CallStream, CallError> {
    let mut avoid: HashSet<PeerId> = HashSet::new();
    let (mut route_retries, mut lookup_retried) = (0u32, false);
    // A stream failed on some connection to the provider: which one is not
    // known, so the retry closes every relayed connection to it.
    let mut close_all = false;
    let mut earlier: Vec<String> = Vec::new();
    loop {
        let retry = route_retries > 0 || lookup_retried;
        let failed = match round(node, service, &avoid, retry, close_all, budget).await {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
        let (reason, pause) = match (&failed.error, failed.routes.last()) {
            (_, Some(f)) if route_retries < MAX_ROUTE_RETRIES => {
                close_all = f.reason == "stream_failed";
                let pause = RETRY_PAUSE * 4u32.pow(route_retries);
                route_retries += 1;
                (f.reason, pause)
            }
            // Every router we asked knew no provider: mid-move (a provider
            // between its old and new routers) that is a moment's gap in
            // the catalog, so ask once more.
            (CallError::NoProviders(_), None) if !lookup_retried => {
                lookup_retried = true;
                ("no_providers", NO_PROVIDERS_PAUSE)
            }
            _ => return Err(with_earlier(failed.error, &earlier)),
        };
        if node.is_shutting_down() || Instant::now() + MIN_RETRY_TIME > budget.deadline {
            return Err(with_earlier(failed.error, &earlier));
        }
        // No provider answered: once more, on a fresh lookup, avoiding the
        // routers whose routes failed.
        node.metrics
            .call_retries
            .get_or_create(&crate::metrics::ReasonLabel { reason })
            .inc();
        avoid.extend(failed.routes.iter().map(|r| r.via));
        tracing::debug!(service, error = %failed.error, ?avoid, "retrying the call on a fresh route");
        earlier.push(failed.error.to_string());
        let pause = pause.mul_f64(1.0 + rand::thread_rng().gen_range(0.0..=2.0));
        tokio::time::sleep(budget.cap(pause)).await;
    }
}

/// `error`, naming the failures that were retried before it.
fn with_earlier(error: CallError, earlier: &[String]) -> CallError {
    match error {
        CallError::Failed {
            service,
            attempts,
            last,
            refused,
            timed_out,
        } if !earlier.is_empty() => CallError::Failed {
            service,
            attempts,
            last: format!("{last} (retried after: {})", earlier.join("; ")),
            refused,
            timed_out,
        },
        other => other,
    }
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
    let skew = node.config.credential_skew.as_secs() as i64;
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

/// One lookup and up to `call_attempts` providers, routes through routers
/// in `avoid` (and routers of ours that are leaving) last. On a `retry`,
/// relayed connections to a provider through routers it no longer lists
/// (or in `avoid`) are closed before the new circuit.
async fn round(
    node: &Arc<Node>,
    service: &str,
    avoid: &HashSet<PeerId>,
    retry: bool,
    close_all: bool,
    budget: Budget,
) -> Result<CallStream, RoundError> {
    let view = node
        .routes(budget.cap(node.config.connect_timeout()))
        .await
        .map_err(|e| match e {
            crate::node::Unanswered::Stopping => CallError::ShuttingDown,
            e @ crate::node::Unanswered::TimedOut(_) => CallError::LookupFailed {
                service: service.to_string(),
                detail: e.to_string(),
            },
        })?;
    let mut avoid = avoid.clone();
    avoid.extend(view.leaving.iter().copied());
    let avoid = &avoid;
    let mut attached = view.attached;
    if attached.is_empty() {
        let why = node.status.borrow().readyz_line();
        return Err(CallError::NotReady(why.trim_end().to_string()).into());
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
    let attached_map: HashMap<PeerId, Multiaddr> = attached.into_iter().collect();
    let mut providers: Vec<(PeerId, Vec<PeerId>)> =
        by_provider.into_iter().map(|(p, (_, r))| (p, r)).collect();
    if providers.is_empty() {
        return Err(CallError::NoProviders(service.to_string()).into());
    }
    providers.shuffle(&mut rand::thread_rng());
    // Providers sharing one of our routers (not avoided) first (stable:
    // keeps the shuffle).
    providers.sort_by_key(|(_, routers)| {
        !routers
            .iter()
            .any(|r| attached_map.contains_key(r) && !avoid.contains(r))
    });

    let attempts = node.config.call_attempts.max(1);
    let mut last = None;
    let mut routes = Vec::new();
    let mut tried = 0;
    for (provider, routers) in providers.into_iter().take(attempts) {
        if tried > 0 && budget.spent() {
            break;
        }
        tried += 1;
        let route = Route {
            attached: &attached_map,
            directory: &view.directory,
            avoid,
            retry,
            close_all,
            budget,
        };
        match attempt(node, service, provider, &routers, route).await {
            Ok(s) => return Ok(s),
            Err(e) if e.denied => {
                // A policy refusal: every provider and router would say
                // the same to this caller for this service.
                tracing::debug!(%provider, service, error = %e.detail, "circuit refused by policy");
                return Err(CallError::Denied {
                    service: service.to_string(),
                    detail: e.detail,
                }
                .into());
            }
            Err(e) => {
                tracing::debug!(%provider, service, error = %e.detail, "provider attempt failed");
                routes.extend(e.route);
                last = Some(e);
            }
        }
    }
    let last = last.unwrap_or_else(|| other_error("no attempt made".into()));
    if last.route.is_none() {
        // The last failure was not the route's: no retry.
        routes.clear();
    }
    Err(RoundError {
        error: CallError::Failed {
            service: service.to_string(),
            attempts: tried,
            last: last.detail,
            refused: last.refused,
            timed_out: last.timed_out,
        },
        routes,
    })
}

/// Becomes admitted for transit at `router`: the engine, which owns
/// every admission, connects and authenticates (or reuses an admission
/// it holds on the same connection, or a router it holds for attach).
async fn transit(
    node: &Arc<Node>,
    router: PeerId,
    addrs: Vec<Multiaddr>,
    budget: Budget,
) -> Result<(), AttemptError> {
    let connect_limit = budget.cap(node.config.connect_timeout());
    let auth_limit = budget.cap(node.config.call_timeout());
    let answer = node
        .ask(connect_limit + auth_limit, |reply| Command::Transit {
            router,
            addrs,
            connect_limit,
            auth_limit,
            reply,
        })
        .await;
    match answer {
        Ok(Ok(())) => Ok(()),
        Ok(Err(TransitError::Connect(e))) => Err(connect_error(e, router)),
        Ok(Err(TransitError::Wire(e))) => Err(AttemptError::wire(e, "connect_failed", router)),
        Ok(Err(e @ TransitError::Refused { .. })) => Err(other_error(e.to_string())),
        Err(Unanswered::Stopping) => Err(connect_error("node is stopping".into(), router)),
        Err(Unanswered::TimedOut(d)) => Err(connect_error(
            format!("no transit admission at {router} within {d:?}"),
            router,
        )),
    }
}

/// What an attempt needs to choose its route.
#[derive(Clone, Copy)]
struct Route<'a> {
    /// Our reserved routers and their addresses.
    attached: &'a HashMap<PeerId, Multiaddr>,
    /// Router addresses from the directory.
    directory: &'a HashMap<PeerId, Vec<Multiaddr>>,
    /// Routers to route around when another way exists.
    avoid: &'a HashSet<PeerId>,
    /// A retry: stale relayed connections to the provider are closed first.
    retry: bool,
    /// A retry after a failed stream: every relayed connection to the
    /// provider is closed first.
    close_all: bool,
    /// The call's deadline.
    budget: Budget,
}

async fn attempt(
    node: &Arc<Node>,
    service: &str,
    provider: PeerId,
    routers: &[PeerId],
    route: Route<'_>,
) -> Result<CallStream, AttemptError> {
    let Route {
        attached,
        directory,
        avoid,
        retry,
        close_all,
        budget,
    } = route;
    let shared_with_us: Vec<PeerId> = routers
        .iter()
        .filter(|r| attached.contains_key(r))
        .copied()
        .collect();
    let fresh = shared_with_us.iter().find(|r| !avoid.contains(r));
    // Transit through a provider's router we do not hold, never an avoided one.
    let known: Vec<(PeerId, Vec<Multiaddr>)> = if fresh.is_some() {
        Vec::new()
    } else {
        routers
            .iter()
            .filter(|r| !avoid.contains(r) && !attached.contains_key(r))
            .filter_map(|r| directory.get(r).map(|a| (*r, a.clone())))
            .collect()
    };
    let transit_via = known.choose(&mut rand::thread_rng()).cloned();
    let (via, addr, is_transit) = if let Some(r) = fresh {
        (*r, attached[r].clone(), false)
    } else if let Some((t, addrs)) = transit_via {
        transit(node, t, addrs.clone(), budget).await?;
        (t, addrs[0].clone(), true)
    } else if let Some(r) = shared_with_us.first() {
        // Only avoided routers are left: better them than nothing.
        (*r, attached[r].clone(), false)
    } else {
        return Err(other_error(format!(
            "none of provider {provider}'s {} routers is in our directory",
            routers.len()
        )));
    };
    let circuit = router_base(&addr, via)
        .with(Protocol::P2pCircuit)
        .with(Protocol::P2p(provider));
    // From here until the call ends, the connection to the provider is in
    // use: never closed for idleness (see `crate::peer_calls`).
    let mut peer_call = node.peer_calls.begin(provider);
    let keep_via = retry.then(|| {
        routers
            .iter()
            .filter(|r| !close_all && (!avoid.contains(r) || **r == via))
            .copied()
            .collect()
    });
    // A connection to the provider through a router we route around (one
    // leaving or let go after its go-away, or whose route just failed) is
    // not reused for a new call: unless `via` is that router, the call
    // dials anew through `via`, so no new call streams through a draining
    // router (the old connection is left to the calls already on it).
    let listed: Vec<PeerId> = routers
        .iter()
        .filter(|r| **r == via || !avoid.contains(r))
        .copied()
        .collect();
    node.connect(
        provider,
        vec![circuit],
        keep_via,
        Some(listed),
        budget.cap(node.config.connect_timeout()),
    )
    .await
    .map_err(|e| {
        if e.denied {
            AttemptError {
                detail: super::refusal::explain(node, service, via, provider),
                refused: false,
                timed_out: false,
                route: None,
                denied: true,
            }
        } else {
            connect_error(explain_circuit_failure(e.detail, via, provider), via)
        }
    })?;
    let (answer, stream, conn) = call_wire::request(
        node.control.clone(),
        provider,
        service,
        node.credential(),
        budget.cap(node.config.call_timeout()),
    )
    .await
    .map_err(|e| AttemptError::wire(e, "stream_failed", via))?;
    // Counted on its connection: a router let go after its go-away stays
    // connected while this call streams through it (`engine::linger`).
    peer_call.carried_by(conn);
    if let CallAnswer::Refused(refusal, detail) = answer {
        return Err(AttemptError {
            detail: format!(
                "provider {provider} refused: {} {detail}",
                refusal.as_str_name(),
            ),
            refused: true,
            timed_out: false,
            route: None,
            denied: false,
        });
    }
    let m = &node.metrics;
    Ok(CallStream::new(
        stream,
        CallRoute {
            provider,
            via_router: via,
            transit: is_transit,
        },
        conn,
        m.call_bytes
            .get_or_create(&DirectionLabel { direction: "sent" })
            .clone(),
        m.call_bytes
            .get_or_create(&DirectionLabel {
                direction: "received",
            })
            .clone(),
        node.in_flight_guard(),
        peer_call,
    ))
}

/// A relayed dial's failure in words a caller can act on: libp2p reports a
/// router's refusal of the circuit as a nested transport error; say which
/// router refused which provider and why.
fn explain_circuit_failure(detail: String, via: PeerId, provider: PeerId) -> String {
    // libp2p's nested dial errors span lines; a reason is one line.
    let detail = detail.split_whitespace().collect::<Vec<_>>().join(" ");
    let why = if detail.contains("resource limit exceeded") {
        "the router refused the circuit: resource limit exceeded (it carries as many circuits \
         as it allows)"
    } else if detail.contains("Relay failed to connect to destination") {
        "the router refused or could not open the circuit to the provider (at its \
         circuits-per-destination or stream limit for the provider, or the provider is gone)"
    } else if detail.contains("Relay has no reservation for destination") {
        "the provider has no reservation on that router (it moved)"
    } else if detail.contains("Remote denied permission") {
        "the router denied the circuit"
    } else {
        return detail;
    };
    format!("router {via} could not carry a call to provider {provider}: {why} [{detail}]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn circuit_refusals_name_the_router_the_provider_and_the_reason() {
        let (via, provider) = (PeerId::random(), PeerId::random());
        let e = explain_circuit_failure(
            "connect to x: Failed to negotiate transport protocol(s): [(/p2p-circuit: \
             Failed to connect to destination.: Remote reported resource limit exceeded.)]"
                .into(),
            via,
            provider,
        );
        assert!(e.contains(&via.to_string()), "{e}");
        assert!(e.contains(&provider.to_string()), "{e}");
        assert!(
            e.contains("refused the circuit: resource limit exceeded"),
            "{e}"
        );
        let e = explain_circuit_failure(
            "Relay failed to connect to destination.".into(),
            via,
            provider,
        );
        assert!(e.contains("circuits-per-destination"), "{e}");
        // Anything else is left as it was, on one line.
        assert_eq!(
            explain_circuit_failure("a:\n   b".into(), via, provider),
            "a: b"
        );
        let plain = "no connection to x within 10s".to_string();
        assert_eq!(explain_circuit_failure(plain.clone(), via, provider), plain);
    }
}
