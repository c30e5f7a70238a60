//! The engine: the one task that owns the swarm and every admission
//! (attach and transit). It keeps K routers (dial → auth → reserve →
//! publish), refreshes the credential, polls the directory, obeys go-away,
//! answers call tasks' commands (connect, routes, transit, report), and
//! drives shutdown (withdraw records, wait for calls in flight, close
//! relayed connections, then the routers').
//!
//! Each concern is a small state machine in its own file, with pure
//! transitions taking `now`: [`slot`] (one router), [`refresh`] (the
//! credential), [`directory`] (the router directory), [`goaway`],
//! [`records`], [`transit`]. Network exchanges run as futures inside this
//! task (`ops`), never blocking the swarm; their results come back as
//! [`Op`] values.

mod connect;
mod conns;
mod direct_auth;
mod directory;
mod directory_keys;
mod goaway;
mod idle;
mod linger;
mod observed;
mod policy_push;
mod records;
mod redial;
mod refresh;
mod report;
mod routers;
mod shun;
mod slot;
mod transit;
mod upgrade_notice;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agentmesh_controlplane::client::ClientError;
use agentmesh_proto::pb::controlplane::{GetDirectoryResponse, RefreshResponse};
use agentmesh_proto::pb::credential::KeySet;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use libp2p::metrics::Recorder as _;
use libp2p::swarm::SwarmEvent;
use libp2p::{PeerId, Swarm};
use rand::Rng;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::command::{Command, Routes};
use crate::node::Node;
use crate::transport::{Behaviour, BehaviourEvent};
use agentmesh_wire::auth::{AuthError, AuthOutcome};
use agentmesh_wire::catalog::{CatalogAnswer, CatalogError};

pub(crate) use routers::router_base;
use slot::Slot;

/// Longest wait for connections to close gracefully at the end of
/// shutdown, for each of the two steps (relayed connections, then the rest).
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// How often timers are checked.
const TICK: Duration = Duration::from_secs(1);

/// A finished network exchange.
pub(crate) enum Op {
    Auth {
        router: PeerId,
        initial: bool,
        result: Result<AuthOutcome, AuthError>,
    },
    Publish {
        router: PeerId,
        result: Result<CatalogAnswer, CatalogError>,
    },
    Withdrawn,
    /// A router's connection failed under its first auth: connect afresh.
    Redial(PeerId),
    /// A lost router's replacement wait ended: top up now.
    TopUp,
    GoAway {
        router: PeerId,
        result: Result<agentmesh_proto::pb::mesh::GoAway, agentmesh_wire::goaway::GoAwayError>,
    },
    /// The directory, and the key set when the fetch read it (see
    /// [`directory_keys`]).
    Directory(Box<Result<(GetDirectoryResponse, Option<KeySet>), directory::FetchError>>),
    Refresh(Box<Result<RefreshResponse, ClientError>>),
    /// A transit request's connection is up (or failed).
    TransitConnected {
        router: PeerId,
        connected: Result<(), crate::command::ConnectError>,
        auth_limit: Duration,
        reply: transit::Reply,
    },
    /// A transit request's auth exchange ended.
    TransitAuth {
        router: PeerId,
        result: Result<AuthOutcome, AuthError>,
        reply: transit::Reply,
    },
    /// A policy push exchange ended, with its metric result.
    PolicyPushed {
        result: &'static str,
    },
    /// A direct connection's hello, to verify again now that the keys
    /// were fetched anew.
    DirectHello {
        peer: PeerId,
        conn: libp2p::swarm::ConnectionId,
        heard: crate::direct::hello::Heard,
    },
    /// A notice of a circuit upgraded away ended (counted in its future).
    UpgradeNoticed,
}

/// The engine's state.
pub(crate) struct Engine {
    node: Arc<Node>,
    swarm: Swarm<Behaviour>,
    cmd_rx: mpsc::Receiver<Command>,
    ops: FuturesUnordered<BoxFuture<'static, Op>>,
    /// The routers we hold or are acquiring.
    slots: HashMap<PeerId, Slot>,
    /// Routers kept out of the choice, and why.
    choice: shun::Choice,
    directory: directory::Directory,
    refresh: refresh::Refresh,
    records: records::Records,
    goaways: agentmesh_streams::IncomingStreams,
    goaway: goaway::GoAways,
    policy_pushes: agentmesh_streams::IncomingStreams,
    pushes: policy_push::Pushes,
    transit: transit::Transit,
    waits: connect::Waits,
    conns: conns::Conns,
    /// Routers let go after their go-away, connected while calls go
    /// through them (see [`linger`]).
    lingering: linger::Lingering,
    /// Relayed connections being closed for idleness (see [`idle`]).
    idle_closing: std::collections::HashSet<libp2p::swarm::ConnectionId>,
    /// The last thing that went wrong holding routers (see
    /// [`crate::NodeStatus::last_router_error`]).
    last_router_error: Option<String>,
    /// libp2p's own metrics, when this node serves `--metrics-addr`.
    p2p_metrics: Option<libp2p::metrics::Metrics>,
}

/// Characters kept of [`crate::NodeStatus::last_router_error`].
const MAX_ERROR_CHARS: usize = 240;

/// `text` cut to at most [`MAX_ERROR_CHARS`] (on a character boundary).
pub(crate) fn bounded(mut text: String) -> String {
    if text.len() > MAX_ERROR_CHARS {
        let mut end = MAX_ERROR_CHARS;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// A random duration in `[base, base * (1 + spread)]`.
pub(crate) fn jittered(base: Duration, spread: f64) -> Duration {
    let f = rand::thread_rng().gen_range(0.0..=spread.max(0.0));
    base.mul_f64(1.0 + f)
}

/// Exponential backoff from `min` doubling per failure up to `max`, jittered by 50%.
pub(crate) fn backoff(failures: u32, min: Duration, max: Duration) -> Duration {
    let exp = min.saturating_mul(1u32 << failures.min(16));
    jittered(exp.min(max), 0.5)
}

/// Records `event` in libp2p's metrics: every swarm event, and the events of
/// the behaviours libp2p-metrics has a recorder for (ping; the relay
/// recorder is for relay servers, so the client's events are not recorded).
fn record_p2p(m: &libp2p::metrics::Metrics, event: &SwarmEvent<BehaviourEvent>) {
    m.record(event);
    if let SwarmEvent::Behaviour(BehaviourEvent::Ping(e)) = event {
        m.record(e);
    }
}

/// The inbound streams of the protocols the engine answers (go-away,
/// policy pushes), registered with the streams behaviour before the swarm
/// runs.
pub(crate) struct Streams {
    goaways: agentmesh_streams::IncomingStreams,
    policy_pushes: agentmesh_streams::IncomingStreams,
}

impl Streams {
    /// Registers to accept calls (returned first, for the inbound-call
    /// acceptor), go-aways and policy pushes.
    pub(crate) fn accept(
        control: &mut agentmesh_streams::Control,
    ) -> Result<(agentmesh_streams::IncomingStreams, Self), crate::SpawnError> {
        use agentmesh_proto::protocols::{CALL, GOAWAY, POLICY};
        let mut accept = |p: &'static str| {
            control
                .accept(libp2p::StreamProtocol::new(p))
                .map_err(|e| crate::SpawnError::Swarm(e.to_string()))
        };
        let calls = accept(CALL)?;
        Ok((
            calls,
            Self {
                goaways: accept(GOAWAY)?,
                policy_pushes: accept(POLICY)?,
            },
        ))
    }
}

/// Starts the engine, watched as task `engine`: a panic in it (a bug here
/// or in libp2p) or its end before shutdown fails the node.
pub(crate) fn spawn(
    node: Arc<Node>,
    swarm: Swarm<Behaviour>,
    cmd_rx: mpsc::Receiver<Command>,
    streams: Streams,
    p2p_metrics: Option<libp2p::metrics::Metrics>,
    tasks: &mut crate::supervise::Tasks,
) {
    let engine = Engine::new(
        node,
        swarm,
        cmd_rx,
        streams.goaways,
        streams.policy_pushes,
        p2p_metrics,
    );
    tasks.spawn("engine", engine.run());
}

impl Engine {
    fn new(
        node: Arc<Node>,
        swarm: Swarm<Behaviour>,
        cmd_rx: mpsc::Receiver<Command>,
        goaways: agentmesh_streams::IncomingStreams,
        policy_pushes: agentmesh_streams::IncomingStreams,
        p2p_metrics: Option<libp2p::metrics::Metrics>,
    ) -> Self {
        let now = Instant::now();
        let interval = node.config.control_plane.directory_interval;
        let max_pushes = node.config.routers.max_policy_pushes_in_flight;
        let mut core = Self {
            node,
            swarm,
            cmd_rx,
            ops: FuturesUnordered::new(),
            slots: HashMap::new(),
            choice: shun::Choice::default(),
            directory: directory::Directory::new(interval, now),
            refresh: refresh::Refresh::new(now),
            records: records::Records::default(),
            goaways,
            goaway: goaway::GoAways::default(),
            policy_pushes,
            pushes: policy_push::Pushes::new(max_pushes),
            transit: transit::Transit::default(),
            waits: connect::Waits::default(),
            conns: conns::Conns::default(),
            lingering: linger::Lingering::default(),
            idle_closing: Default::default(),
            last_router_error: None,
            p2p_metrics,
        };
        let ours = core.node.credential();
        core.swarm.behaviour_mut().direct.set_credential(ours);
        core.schedule_refresh();
        core.publish_status();
        core
    }

    /// Runs until shutdown completes.
    pub(crate) async fn run(mut self) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shutdown = self.node.shutdown.clone();
        // Each new policy or revocation list judges the direct connections
        // again (`direct_auth`).
        let mut policy_changes = self.node.policy.subscribe();
        loop {
            tokio::select! {
                biased;
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        break;
                    }
                }
                Ok(()) = policy_changes.changed() => self.recheck_direct(),
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                Some(cmd) = self.cmd_rx.recv() => self.on_command(cmd),
                Some((info, stream)) = self.goaways.next() => self.on_goaway_stream(info.peer, stream),
                Some((info, stream)) = self.policy_pushes.next() => self.on_policy_stream(info.peer, stream),
                Some(op) = self.ops.next(), if !self.ops.is_empty() => self.on_op(op),
                _ = tick.tick() => self.on_tick(),
            }
        }
        self.stop().await;
    }

    /// Shutdown: withdraw records, then keep the swarm running until calls
    /// in flight finish or the grace ends; then close the relayed
    /// connections (calls' circuits) and wait for them, and only then the
    /// routers' connections that carry those circuits.
    async fn stop(mut self) {
        tracing::debug!(
            in_flight = self.node.in_flight.load(Ordering::SeqCst),
            "shutdown begins"
        );
        let grace = self.node.config.shutdown_grace;
        let deadline = Instant::now() + grace;
        self.node.status.send_modify(|s| {
            s.stopping = true;
            s.ready = false;
        });
        self.node.metrics.routers.ready.set(0);
        self.withdraw_all();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            let idle = self.node.in_flight.load(Ordering::SeqCst) == 0;
            let withdrawn = self.records.withdraws_pending == 0;
            if (idle && withdrawn) || Instant::now() >= deadline {
                tracing::debug!(idle, withdrawn, "shutdown: swarm stops");
                break;
            }
            tokio::select! {
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                Some(op) = self.ops.next(), if !self.ops.is_empty() => {
                    // Only withdrawals matter now; other results are dropped.
                    if let Op::Withdrawn = op {
                        self.records.withdraws_pending =
                            self.records.withdraws_pending.saturating_sub(1);
                    }
                }
                _ = tick.tick() => {}
            }
        }
        let left = self.node.in_flight.load(Ordering::SeqCst);
        if left > 0 {
            tracing::warn!(calls = left, "shutdown grace over with calls in flight");
        }
        // Close connections gracefully so the last bytes and stream closes
        // written by finished calls reach their peers before the swarm
        // goes. Relayed connections first: each rides on a stream of a
        // router connection, and closing both at once could drop what the
        // relayed one still had queued.
        for r in self.conns.relayed() {
            self.swarm.close_connection(r.id);
        }
        self.close_until(CLOSE_GRACE, |core| core.conns.relayed().is_empty())
            .await;
        let peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        for p in peers {
            let _ = self.swarm.disconnect_peer_id(p);
        }
        self.close_until(CLOSE_GRACE, |core| {
            core.swarm.connected_peers().next().is_none()
        })
        .await;
    }

    /// Runs the swarm until `done` or for at most `limit`, keeping only
    /// track of connections (routers closing now are not lost ones).
    async fn close_until(&mut self, limit: Duration, done: impl Fn(&Self) -> bool) {
        let close_by = Instant::now() + limit;
        while !done(self) {
            match tokio::time::timeout_at(close_by, self.swarm.select_next_some()).await {
                Ok(SwarmEvent::ConnectionClosed {
                    peer_id,
                    connection_id,
                    ..
                }) => self.conns.closed(peer_id, connection_id),
                Ok(SwarmEvent::ConnectionEstablished { connection_id, .. }) => {
                    // Too late for it: close it with the rest.
                    self.swarm.close_connection(connection_id);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Connect {
                peer,
                addrs,
                keep_via,
                listed,
                suspect,
                reply,
            } => self.on_connect(peer, addrs, (keep_via, listed), suspect, reply),
            Command::Routes { reply } => {
                let _ = reply.send(self.routes());
            }
            Command::Transit {
                router,
                addrs,
                connect_limit,
                auth_limit,
                reply,
            } => self.on_transit(router, addrs, connect_limit, auth_limit, reply),
            Command::Report { reply } => {
                let _ = reply.send(self.report());
            }
        }
    }

    /// What a call may use now: our reserved routers (with the address we
    /// reached them at), those leaving, the directory's addresses.
    fn routes(&self) -> Routes {
        Routes {
            attached: self
                .slots
                .iter()
                .filter(|(_, s)| s.is_reserved())
                .filter_map(|(p, s)| s.addr.clone().map(|a| (*p, a)))
                .collect(),
            leaving: self
                .slots
                .iter()
                .filter(|(_, s)| s.leaving.is_some())
                .map(|(p, _)| *p)
                .chain(self.lingering.routers().copied())
                .collect(),
            directory: self.directory.addrs(),
        }
    }

    fn on_swarm_event(&mut self, event: SwarmEvent<BehaviourEvent>) {
        if let Some(m) = &self.p2p_metrics {
            record_p2p(m, &event);
        }
        if let SwarmEvent::ConnectionClosed {
            peer_id,
            cause,
            endpoint,
            ..
        } = &event
        {
            tracing::debug!(peer = %peer_id, ?cause, addr = %endpoint.get_remote_address(), "connection closed");
        }
        match event {
            SwarmEvent::ConnectionEstablished {
                peer_id,
                endpoint,
                connection_id,
                ..
            } => {
                self.conns
                    .established(peer_id, connection_id, &endpoint, Instant::now());
                self.resolve_waiters(&peer_id, Ok(()));
                self.on_router_connected(peer_id, endpoint.get_remote_address().clone());
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                num_established,
                ..
            } => {
                self.conns.closed(peer_id, connection_id);
                self.idle_closing.remove(&connection_id);
                if num_established == 0 {
                    self.forget_observed(&peer_id);
                    self.transit.disconnected(&peer_id);
                    self.lingering_closed(&peer_id);
                    self.on_router_lost(peer_id);
                }
                self.resume_fresh(peer_id);
            }
            SwarmEvent::OutgoingConnectionError {
                connection_id,
                peer_id: Some(peer),
                error,
            } if self.swarm.behaviour().direct.is_punch(&connection_id) => {
                // A hole punch that did not get through: the relayed
                // connection stays, and its failure is no caller's.
                tracing::debug!(%peer, %error, "punch dial failed");
                self.after_punch_failed(peer);
            }
            SwarmEvent::OutgoingConnectionError {
                peer_id: Some(peer),
                error,
                ..
            } => {
                // Waiters left while connected wait for a new connection
                // (dialed anew): that dial failed too.
                let after = self.node.config.connect_timeout();
                self.resolve_waiters(&peer, Err(connect::dial_failure(&peer, &error, after)));
                self.on_router_dial_failed(peer, &error.to_string());
            }
            SwarmEvent::Behaviour(BehaviourEvent::Direct(crate::direct::Event::Hello {
                peer,
                connection,
                heard,
            })) => self.on_direct_hello(peer, connection, heard, false),
            SwarmEvent::Behaviour(BehaviourEvent::Direct(crate::direct::Event::Punched(e))) => {
                tracing::trace!(peer = %e.remote_peer_id, ok = e.result.is_ok(), "punch ended");
            }
            SwarmEvent::Behaviour(BehaviourEvent::Relay(
                libp2p::relay::client::Event::ReservationReqAccepted { relay_peer_id, .. },
            )) => self.on_reserved(relay_peer_id),
            SwarmEvent::ListenerClosed {
                listener_id,
                reason,
                ..
            } => self.on_listener_closed(listener_id, reason.err().map(|e| e.to_string())),
            SwarmEvent::ListenerError { listener_id, error } => {
                tracing::debug!(?listener_id, %error, "relay listener error");
            }
            // libp2p-ping reports a failed ping but no longer closes the
            // connection: one whose pings go unanswered is dead (a link
            // down, a NAT that lost its mapping) and TCP would take many
            // minutes to say so. Closing it lets its router be replaced or
            // redialed (within ping interval + timeout, 15 + 20 s).
            SwarmEvent::Behaviour(BehaviourEvent::Ping(libp2p::ping::Event {
                peer,
                connection,
                result: Err(error),
            })) if !matches!(error, libp2p::ping::Failure::Unsupported) => {
                if let Some(suppressed) = self.node.metrics.log.pass(&peer, "ping_failed") {
                    tracing::info!(%peer, %error, suppressed, "ping failed: closing the connection (logged at most once a minute per peer)");
                }
                self.swarm.close_connection(connection);
            }
            _ => {}
        }
    }

    fn on_op(&mut self, op: Op) {
        match op {
            Op::Auth {
                router,
                initial,
                result,
            } => self.on_auth(router, initial, result),
            Op::Publish { router, result } => self.on_published(router, result),
            Op::Withdrawn | Op::UpgradeNoticed => {}
            Op::Redial(router) => self.redial(router),
            Op::TopUp => self.top_up(),
            Op::GoAway { router, result } => self.on_goaway(router, result),
            Op::PolicyPushed { result } => self.on_policy_pushed(result),
            Op::DirectHello { peer, conn, heard } => self.on_direct_hello(peer, conn, heard, true),
            Op::Directory(result) => self.on_directory(*result),
            Op::Refresh(result) => self.on_refresh(*result),
            Op::TransitConnected {
                router,
                connected,
                auth_limit,
                reply,
            } => self.on_transit_connected(router, connected, auth_limit, reply),
            Op::TransitAuth {
                router,
                result,
                reply,
            } => self.on_transit_auth(router, result, reply),
        }
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        self.choice.expire(now);
        if self.refresh.due(now) {
            self.start_refresh();
        }
        self.top_up();
        self.update_hurry(now);
        if self.directory.due(now) {
            self.start_directory();
        }
        self.release_leaving();
        self.retry_reservations(now);
        self.retry_represent(now);
        self.close_idle_relayed(now);
        self.swarm
            .behaviour_mut()
            .direct
            .expire_unauthenticated(now);
        self.step_lingering(now);
        let ttl = self
            .node
            .config
            .services
            .record_ttl
            .max(Duration::from_secs(3));
        if self.records.due(now, ttl) {
            self.publish_records();
        }
    }

    /// Remembers what just went wrong with `router` for the status (the
    /// last one only, at most [`MAX_ERROR_CHARS`]); shown from the next
    /// status change on.
    pub(super) fn note_error(&mut self, router: PeerId, what: impl std::fmt::Display) {
        self.last_router_error = Some(bounded(format!("router {router}: {what}")));
    }

    /// Recomputes readiness and the status watch from the slots.
    fn publish_status(&mut self) {
        // A failed task keeps the node failed and not ready (`supervise`).
        let s = crate::supervise::keep_failure(self.status_snapshot(), &self.node.status.borrow());
        let m = &self.node.metrics;
        m.routers.routers_attached.set(s.reserved.len() as i64);
        m.routers.routers_wanted.set(s.routers_wanted as i64);
        m.routers.router_candidates.set(s.candidates as i64);
        m.routers.ready.set(i64::from(s.ready));
        self.node.status.send_if_modified(|old| {
            let s = crate::supervise::keep_failure(s, old);
            if *old == s {
                false
            } else {
                *old = s;
                true
            }
        });
    }
}
