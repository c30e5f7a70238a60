//! One attempt at one provider: choose the router to reach it through (one
//! of ours it shares, else a transit admission at one of its routers),
//! connect through it, and ask for the call.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use agentmesh_wire::call::{self as call_wire, CallAnswer};
use libp2p::core::multiaddr::Protocol;
use libp2p::swarm::ConnectionId;
use libp2p::{Multiaddr, PeerId};
use rand::seq::SliceRandom as _;

use super::Budget;
use super::failure::AttemptError;
use crate::call::{CallRoute, CallStream};
use crate::command::{Command, TransitError};
use crate::engine::router_base;
use crate::node::Node;

/// What an attempt needs to choose its route.
#[derive(Clone, Copy)]
pub(super) struct Route<'a> {
    /// Our reserved routers and their addresses.
    pub(super) attached: &'a HashMap<PeerId, Multiaddr>,
    /// Router addresses from the directory.
    pub(super) directory: &'a HashMap<PeerId, Vec<Multiaddr>>,
    /// Routers to route around when another way exists.
    pub(super) avoid: &'a HashSet<PeerId>,
    /// A retry: stale relayed connections to the provider are closed first.
    pub(super) retry: bool,
    /// A retry after a failed stream: every relayed connection to the
    /// provider is closed first.
    pub(super) close_all: bool,
    /// A retry after a stream failed on this direct connection to the
    /// provider: it is closed first, the relayed ones kept.
    pub(super) suspect: Option<ConnectionId>,
    /// A call, or a probe the provider answers without its backend.
    pub(super) intent: super::Intent,
    /// The call's deadline.
    pub(super) budget: Budget,
}

/// The router chosen to reach a provider through.
struct Via {
    router: PeerId,
    addr: Multiaddr,
    transit: bool,
}

/// Calls `service` on `provider`, whose record names `routers`.
pub(super) async fn attempt(
    node: &Arc<Node>,
    service: &str,
    provider: PeerId,
    routers: &[PeerId],
    route: Route<'_>,
) -> Result<CallStream, AttemptError> {
    let via = choose(node, provider, routers, route).await?;
    let Route {
        avoid,
        retry,
        close_all,
        suspect,
        intent,
        budget,
        ..
    } = route;
    let circuit = router_base(&via.addr, via.router)
        .with(Protocol::P2pCircuit)
        .with(Protocol::P2p(provider));
    // From here until the call ends, the connection to the provider is in
    // use: never closed for idleness (see `crate::peer_calls`).
    let mut peer_call = node.peer_calls.begin(provider);
    let keep_via = retry.then(|| {
        routers
            .iter()
            .filter(|r| !close_all && (!avoid.contains(r) || **r == via.router))
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
        .filter(|r| **r == via.router || !avoid.contains(r))
        .copied()
        .collect();
    let limit = budget.cap(node.config.connect_timeout());
    if let Err(error) = node
        .connect(
            provider,
            vec![circuit],
            (keep_via, Some(listed)),
            suspect,
            limit,
        )
        .await
    {
        return Err(if error.is_denied() {
            AttemptError::Denied {
                detail: crate::call::refusal::explain(node, service, via.router, provider),
            }
        } else {
            AttemptError::Circuit {
                via: via.router,
                provider,
                error,
            }
        });
    }
    let asked = tokio::time::Instant::now();
    // Where the stream will open (the newest connection): if it fails, a
    // direct connection is what the retry drops.
    let on = node.control.newest_connection(&provider);
    let mut req = call_wire::request_for(service, node.credential());
    req.probe = intent == super::Intent::Probe;
    let (answer, stream, info) = call_wire::send(
        node.control.clone(),
        provider,
        req,
        budget.cap(node.config.call_timeout()),
    )
    .await
    .map_err(|error| AttemptError::Stream {
        via: via.router,
        error,
        on,
    })?;
    let answered_in = asked.elapsed();
    let conn = info.connection;
    // Counted on its connection: a router let go after its go-away stays
    // connected while this call streams through it (`engine::linger`).
    peer_call.carried_by(conn);
    if let CallAnswer::Refused(refusal, detail) = answer {
        return Err(AttemptError::Refused {
            provider,
            refusal,
            detail,
        });
    }
    // Streams open on the peer's newest connection: the direct one once
    // a punch brought it up, the relayed one before.
    node.metrics.direct.call_path(!info.relayed);
    Ok(CallStream::new(
        stream,
        CallRoute {
            provider,
            via_router: via.router,
            transit: via.transit,
            direct: !info.relayed,
        },
        conn,
        answered_in,
        (&node.metrics.calls, &node.metrics.direct),
        node.in_flight_guard(),
        peer_call,
    ))
}

/// The router to reach `provider` through: one of ours it lists (not
/// avoided), else one of its routers we do not hold, admitted for transit
/// (never an avoided one), else an avoided one of ours rather than none.
async fn choose(
    node: &Arc<Node>,
    provider: PeerId,
    routers: &[PeerId],
    route: Route<'_>,
) -> Result<Via, AttemptError> {
    let Route {
        attached,
        directory,
        avoid,
        budget,
        ..
    } = route;
    let shared_with_us: Vec<PeerId> = routers
        .iter()
        .filter(|r| attached.contains_key(r))
        .copied()
        .collect();
    if let Some(r) = shared_with_us.iter().find(|r| !avoid.contains(r)) {
        return Ok(Via {
            router: *r,
            addr: attached[r].clone(),
            transit: false,
        });
    }
    let known: Vec<(PeerId, Vec<Multiaddr>)> = routers
        .iter()
        .filter(|r| !avoid.contains(r) && !attached.contains_key(r))
        .filter_map(|r| directory.get(r).map(|a| (*r, a.clone())))
        .collect();
    let picked = known.choose(&mut rand::thread_rng()).cloned();
    if let Some((t, addrs)) = picked {
        let addr = addrs[0].clone();
        transit(node, t, addrs, budget)
            .await
            .map_err(|error| AttemptError::Transit { via: t, error })?;
        return Ok(Via {
            router: t,
            addr,
            transit: true,
        });
    }
    match shared_with_us.first() {
        // Only avoided routers are left: better them than nothing.
        Some(r) => Ok(Via {
            router: *r,
            addr: attached[r].clone(),
            transit: false,
        }),
        None => Err(AttemptError::NoRoute {
            provider,
            routers: routers.len(),
        }),
    }
}

/// Becomes admitted for transit at `router`: the engine, which owns
/// every admission, connects and authenticates (or reuses an admission
/// it holds on the same connection, or a router it holds for attach).
async fn transit(
    node: &Arc<Node>,
    router: PeerId,
    addrs: Vec<Multiaddr>,
    budget: Budget,
) -> Result<(), TransitError> {
    let connect_limit = budget.cap(node.config.connect_timeout());
    let auth_limit = budget.cap(node.config.call_timeout());
    node.ask(connect_limit + auth_limit, |reply| Command::Transit {
        router,
        addrs,
        connect_limit,
        auth_limit,
        reply,
    })
    .await
    .map_err(|e| TransitError::unanswered(router, e))?
}
