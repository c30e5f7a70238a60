//! The core loop: the one task that owns the swarm. It keeps K routers
//! (dial → auth → reserve → publish), refreshes the credential, polls the
//! directory, answers connection requests from call tasks, and drives
//! shutdown (withdraw records, wait for calls in flight).
//!
//! Network exchanges run as futures inside this task (`ops`), never blocking
//! the swarm; their results come back as [`Op`] values.

mod conns;
mod goaway;
mod idle;
mod redial;
mod routers;
mod shun;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use agentmesh_controlplane::client::ClientError;
use agentmesh_proto::credential::peek_claims;
use agentmesh_proto::pb::controlplane::{GetDirectoryResponse, RefreshResponse};
use agentmesh_proto::pb::credential::KeySet;
use agentmesh_proto::pb::mesh::CatalogResponse;
use agentmesh_proto::unix_now;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use libp2p::metrics::Recorder as _;
use libp2p::swarm::SwarmEvent;
use libp2p::{PeerId, Swarm};
use rand::Rng;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::shared::{Command, Shared};
use crate::transport::{Behaviour, BehaviourEvent};
use crate::wire::{AuthOutcome, WireError};
use routers::Slot;
pub(crate) use routers::router_base;

/// Most connection waiters held at once (call tasks waiting for a dial).
const MAX_WAITERS: usize = 4096;
/// Longest wait for connections to close gracefully at the end of shutdown.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// How often timers are checked.
const TICK: Duration = Duration::from_secs(1);

/// A finished network exchange.
pub(crate) enum Op {
    Auth {
        router: PeerId,
        initial: bool,
        result: Result<AuthOutcome, WireError>,
    },
    Publish {
        router: PeerId,
        result: Result<CatalogResponse, WireError>,
    },
    Withdrawn,
    /// A router's connection failed under its first auth: connect afresh.
    Redial(PeerId),
    GoAway {
        router: PeerId,
        result: Result<agentmesh_proto::pb::mesh::GoAway, String>,
    },
    Directory(Box<Result<(GetDirectoryResponse, KeySet), ClientError>>),
    Refresh(Box<Result<RefreshResponse, ClientError>>),
}

/// A connect that waits for stale relayed connections to close first.
struct FreshWait {
    peer: PeerId,
    closing: Vec<libp2p::swarm::ConnectionId>,
    addrs: Vec<libp2p::Multiaddr>,
    reply: oneshot::Sender<Result<(), String>>,
}

/// The core loop's state.
pub(crate) struct Core {
    shared: Arc<Shared>,
    swarm: Swarm<Behaviour>,
    cmd_rx: mpsc::Receiver<Command>,
    slots: HashMap<PeerId, Slot>,
    shunned: HashMap<PeerId, shun::Shun>,
    /// Failures in a row per router (escalates shunning; cleared on a reservation).
    failures: HashMap<PeerId, u32>,
    /// Connection failures in a row per router (backoff; cleared on admission).
    redials: HashMap<PeerId, redial::Redials>,
    candidates: Vec<crate::select::Candidate>,
    have_directory: bool,
    ops: FuturesUnordered<BoxFuture<'static, Op>>,
    waiters: HashMap<PeerId, Vec<oneshot::Sender<Result<(), String>>>>,
    /// Connects waiting for stale connections to close (at most [`MAX_WAITERS`]).
    fresh: Vec<FreshWait>,
    conns: conns::Conns,
    /// Relayed connections being closed for idleness (see [`idle`]).
    idle_closing: std::collections::HashSet<libp2p::swarm::ConnectionId>,
    next_refresh: Instant,
    refresh_failures: u32,
    refresh_in_flight: bool,
    next_directory: Instant,
    directory_failures: u32,
    directory_in_flight: bool,
    records_dirty: bool,
    last_publish: Option<Instant>,
    withdraws_pending: usize,
    goaways: agentmesh_streams::IncomingStreams,
    goaways_pending: usize,
    warned_no_router: bool,
    publish_retry_at: Option<Instant>,
    /// The last thing that went wrong holding routers (see
    /// [`crate::NodeStatus::last_router_error`]).
    last_router_error: Option<String>,
    /// libp2p's own metrics, when this node serves `--metrics-addr`.
    p2p_metrics: Option<libp2p::metrics::Metrics>,
}

/// Characters kept of [`crate::NodeStatus::last_router_error`].
const MAX_ERROR_CHARS: usize = 240;

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

impl Core {
    pub(crate) fn new(
        shared: Arc<Shared>,
        swarm: Swarm<Behaviour>,
        cmd_rx: mpsc::Receiver<Command>,
        goaways: agentmesh_streams::IncomingStreams,
        p2p_metrics: Option<libp2p::metrics::Metrics>,
    ) -> Self {
        let now = Instant::now();
        let mut core = Self {
            shared,
            swarm,
            cmd_rx,
            slots: HashMap::new(),
            shunned: HashMap::new(),
            failures: HashMap::new(),
            redials: HashMap::new(),
            candidates: Vec::new(),
            have_directory: false,
            ops: FuturesUnordered::new(),
            waiters: HashMap::new(),
            fresh: Vec::new(),
            conns: conns::Conns::default(),
            idle_closing: Default::default(),
            next_refresh: now,
            refresh_failures: 0,
            refresh_in_flight: false,
            next_directory: now,
            directory_failures: 0,
            directory_in_flight: false,
            records_dirty: false,
            last_publish: None,
            withdraws_pending: 0,
            goaways,
            goaways_pending: 0,
            warned_no_router: false,
            publish_retry_at: None,
            last_router_error: None,
            p2p_metrics,
        };
        core.schedule_refresh();
        core.publish_status();
        core
    }

    /// Runs until shutdown completes.
    pub(crate) async fn run(mut self) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shutdown = self.shared.shutdown.clone();
        loop {
            tokio::select! {
                biased;
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        break;
                    }
                }
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                Some(cmd) = self.cmd_rx.recv() => self.on_command(cmd),
                Some((info, stream)) = self.goaways.next() => self.on_goaway_stream(info.peer, stream),
                Some(op) = self.ops.next(), if !self.ops.is_empty() => self.on_op(op),
                _ = tick.tick() => self.on_tick(),
            }
        }
        self.stop().await;
    }

    /// Shutdown: withdraw records, then keep the swarm running until calls
    /// in flight finish or the grace ends.
    async fn stop(mut self) {
        tracing::debug!(
            in_flight = self.shared.in_flight.load(Ordering::SeqCst),
            "shutdown begins"
        );
        let grace = Duration::from_secs(self.shared.config.shutdown_grace_secs);
        let deadline = Instant::now() + grace;
        self.shared.status.send_modify(|s| {
            s.stopping = true;
            s.ready = false;
        });
        self.shared.metrics.ready.set(0);
        self.shared.ready.send_replace(false);
        self.withdraw_all();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            let idle = self.shared.in_flight.load(Ordering::SeqCst) == 0;
            let withdrawn = self.withdraws_pending == 0;
            if (idle && withdrawn) || Instant::now() >= deadline {
                tracing::debug!(idle, withdrawn, "shutdown: swarm stops");
                break;
            }
            tokio::select! {
                event = self.swarm.select_next_some() => self.on_swarm_event(event),
                Some(op) = self.ops.next(), if !self.ops.is_empty() => {
                    // Only withdrawals matter now; other results are dropped.
                    if let Op::Withdrawn = op {
                        self.withdraws_pending = self.withdraws_pending.saturating_sub(1);
                    }
                }
                _ = tick.tick() => {}
            }
        }
        let left = self.shared.in_flight.load(Ordering::SeqCst);
        if left > 0 {
            tracing::warn!(calls = left, "shutdown grace over with calls in flight");
        }
        // Close connections gracefully so the last bytes and stream closes
        // written by finished calls reach their peers before the swarm goes.
        let peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        for p in peers {
            let _ = self.swarm.disconnect_peer_id(p);
        }
        let close_by = Instant::now() + CLOSE_GRACE;
        while self.swarm.connected_peers().next().is_some() {
            match tokio::time::timeout_at(close_by, self.swarm.select_next_some()).await {
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
                reply,
            } => {
                // Connections being closed for idleness must be gone
                // before the call opens its stream.
                let mut stale = self.conns.open_among(&peer, &self.idle_closing);
                if let Some(keep) = keep_via {
                    stale.extend(self.conns.stale(&peer, &keep));
                    stale.sort();
                    stale.dedup();
                }
                if !stale.is_empty() {
                    self.fresh.retain(|w| !w.reply.is_closed());
                    if self.fresh.len() >= MAX_WAITERS {
                        let _ = reply.send(Err("too many connections pending".into()));
                        return;
                    }
                    tracing::debug!(%peer, stale = stale.len(), "closing relayed connections through routers the peer left (or idle)");
                    for id in &stale {
                        self.swarm.close_connection(*id);
                    }
                    self.fresh.push(FreshWait {
                        peer,
                        closing: stale,
                        addrs,
                        reply,
                    });
                    return;
                }
                // Reached only through routers the peer no longer lists
                // (it left them or is leaving them): a new connection
                // through a listed one, the old ones left to their calls.
                let anew = listed.as_ref().is_some_and(|routers| {
                    self.swarm.is_connected(&peer) && !self.conns.usable(&peer, routers)
                });
                if anew {
                    tracing::debug!(%peer, "connected only through routers the peer no longer lists: dialing anew");
                }
                self.connect_now(peer, addrs, reply, anew);
            }
        }
    }

    /// Replies once connected to `peer`, dialing `addrs` unless already
    /// (or, `anew`, once a new connection is up).
    fn connect_now(
        &mut self,
        peer: PeerId,
        addrs: Vec<libp2p::Multiaddr>,
        reply: oneshot::Sender<Result<(), String>>,
        anew: bool,
    ) {
        {
            {
                if self.swarm.is_connected(&peer) && !anew {
                    let _ = reply.send(Ok(()));
                    return;
                }
                let waiting: usize = self.waiters.values().map(Vec::len).sum();
                if waiting >= MAX_WAITERS {
                    let _ = reply.send(Err("too many connections pending".into()));
                    return;
                }
                if anew && let Some(w) = self.waiters.get_mut(&peer) {
                    // A new connection is already being dialed for other
                    // calls: wait for the same one.
                    w.retain(|s| !s.is_closed());
                    if !w.is_empty() {
                        w.push(reply);
                        return;
                    }
                }
                let condition = if anew {
                    libp2p::swarm::dial_opts::PeerCondition::Always
                } else {
                    libp2p::swarm::dial_opts::PeerCondition::DisconnectedAndNotDialing
                };
                let opts = libp2p::swarm::dial_opts::DialOpts::peer_id(peer)
                    .addresses(addrs)
                    .condition(condition)
                    .build();
                match self.swarm.dial(opts) {
                    Ok(()) | Err(libp2p::swarm::DialError::DialPeerConditionFalse(_)) => {
                        let w = self.waiters.entry(peer).or_default();
                        w.retain(|s| !s.is_closed());
                        w.push(reply);
                    }
                    Err(e) => {
                        let _ = reply.send(Err(format!("dial {peer}: {e}")));
                    }
                }
            }
        }
    }

    /// After a connection to `peer` closed: connects waiting for it go on.
    fn resume_fresh(&mut self, peer: PeerId) {
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.fresh)
            .into_iter()
            .partition(|w| w.peer == peer && !self.conns.any_open(&peer, &w.closing));
        self.fresh = waiting;
        for w in ready {
            self.connect_now(w.peer, w.addrs, w.reply, false);
        }
    }

    fn resolve_waiters(&mut self, peer: &PeerId, result: Result<(), String>) {
        if let Some(ws) = self.waiters.remove(peer) {
            for w in ws {
                let _ = w.send(result.clone());
            }
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
                    self.shared.transit_admitted.lock().remove(&peer_id);
                    self.on_router_lost(peer_id);
                }
                self.resume_fresh(peer_id);
            }
            SwarmEvent::OutgoingConnectionError {
                peer_id: Some(peer),
                error,
                ..
            } => {
                // Waiters left while connected wait for a new connection
                // (dialed anew): that dial failed too.
                self.resolve_waiters(&peer, Err(format!("connect to {peer}: {error}")));
                self.on_router_dial_failed(peer, &error.to_string());
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
            Op::Withdrawn => {}
            Op::Redial(router) => self.redial(router),
            Op::GoAway { router, result } => self.on_goaway(router, result),
            Op::Directory(result) => self.on_directory(*result),
            Op::Refresh(result) => self.on_refresh(*result),
        }
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        self.shunned.retain(|_, s| s.until > now);
        if !self.refresh_in_flight && now >= self.next_refresh {
            self.start_refresh();
        }
        if !self.directory_in_flight && now >= self.next_directory {
            self.start_directory();
        }
        self.top_up();
        self.release_leaving();
        self.retry_reservations(now);
        self.retry_represent(now);
        self.close_idle_relayed(now);
        let ttl = Duration::from_secs(self.shared.config.record_ttl_secs.max(3));
        let stale = self.last_publish.is_some_and(|t| t.elapsed() >= ttl / 3);
        if self.publish_retry_at.is_some_and(|t| t <= now) {
            self.publish_retry_at = None;
            self.records_dirty = true;
        }
        if self.records_dirty || stale {
            self.publish_records();
        }
    }

    fn schedule_refresh(&mut self) {
        let claims = peek_claims(&self.shared.credential()).unwrap_or_default();
        let now = unix_now();
        let lifetime = (claims.expires_at_unix_secs - claims.issued_at_unix_secs).max(3);
        // Two thirds through the lifetime, minus up to 10% of it as jitter.
        let jitter = rand::thread_rng().gen_range(0..=lifetime / 10);
        let at = claims.issued_at_unix_secs + lifetime * 2 / 3 - jitter;
        let wait = (at - now).max(1) as u64;
        self.next_refresh = Instant::now() + Duration::from_secs(wait);
        self.shared
            .metrics
            .credential_expires_at
            .set(claims.expires_at_unix_secs);
    }

    fn start_refresh(&mut self) {
        self.refresh_in_flight = true;
        let shared = self.shared.clone();
        self.ops.push(Box::pin(async move {
            let cred = shared.credential();
            let r = match shared.client.refresh(&cred, &shared.key).await {
                // Refused for good (unknown node, expired past the grace):
                // enroll again if we still have a token.
                Err(ClientError::Refused(status)) if !shared.config.token.is_empty() => {
                    tracing::warn!(%status, "refresh refused: enrolling again with the token");
                    let e = shared
                        .client
                        .enroll(&shared.config.token, &shared.key)
                        .await;
                    shared.metrics.cp("enroll", e.is_ok());
                    e.map(|e| RefreshResponse {
                        credential: e.credential,
                        keys: e.keys,
                    })
                }
                other => other,
            };
            Op::Refresh(Box::new(r))
        }));
    }

    fn on_refresh(&mut self, result: Result<RefreshResponse, ClientError>) {
        self.refresh_in_flight = false;
        let fresh = result.map_err(|e| e.to_string()).and_then(|r| {
            let cred = r.credential.ok_or("refresh answer without credential")?;
            Ok((cred, r.keys))
        });
        match fresh {
            Ok((cred, keys)) => {
                self.shared.metrics.cp("refresh", true);
                self.refresh_failures = 0;
                *self.shared.credential.write() = cred.clone();
                if let Some(keys) = &keys {
                    self.shared.set_keys(keys);
                }
                let dir = self.shared.config.data_dir.clone();
                tokio::task::spawn_blocking(move || {
                    if let Err(e) = crate::identity::store_credential(&dir, &cred) {
                        tracing::warn!(error = %e, "could not store the refreshed credential");
                    }
                    if let Some(Err(e)) = keys.map(|k| crate::identity::store_keys(&dir, &k)) {
                        tracing::warn!(error = %e, "could not store the key set");
                    }
                });
                self.schedule_refresh();
                self.represent_all();
                self.publish_status();
            }
            Err(e) => {
                self.shared.metrics.cp("refresh", false);
                self.refresh_failures += 1;
                let wait = backoff(
                    self.refresh_failures,
                    Duration::from_secs(5),
                    Duration::from_secs(120),
                );
                tracing::warn!(error = %e, retry_in = ?wait, "credential refresh failed");
                self.next_refresh = Instant::now() + wait;
            }
        }
    }

    fn start_directory(&mut self) {
        self.directory_in_flight = true;
        let shared = self.shared.clone();
        self.ops.push(Box::pin(async move {
            let r = async {
                let dir = shared.client.get_directory().await?;
                let keys = shared.client.get_keys().await?;
                Ok((dir, keys))
            }
            .await;
            Op::Directory(Box::new(r))
        }));
    }

    fn on_directory(&mut self, result: Result<(GetDirectoryResponse, KeySet), ClientError>) {
        self.directory_in_flight = false;
        let interval = Duration::from_secs(self.shared.config.directory_interval_secs.max(1));
        match result {
            Ok((dir, keys)) => {
                self.shared.metrics.cp("directory", true);
                self.directory_failures = 0;
                let mut trust = (*self.shared.trust()).clone();
                trust.set_keys(&keys);
                trust.set_revocations(&dir.revocations);
                *self.shared.trust.write() = Arc::new(trust);
                self.candidates = dir
                    .routers
                    .iter()
                    .filter_map(crate::select::Candidate::from_info)
                    .collect();
                *self.shared.router_addrs.write() = self
                    .candidates
                    .iter()
                    .map(|c| (c.peer, c.addrs.clone()))
                    .collect();
                self.have_directory = true;
                let known: std::collections::HashSet<PeerId> =
                    self.candidates.iter().map(|c| c.peer).collect();
                self.failures.retain(|p, _| known.contains(p));
                self.redials.retain(|p, _| known.contains(p));
                self.warned_no_router = false;
                let dir_path = self.shared.config.data_dir.clone();
                tokio::task::spawn_blocking(move || {
                    if let Err(e) = crate::identity::store_keys(&dir_path, &keys) {
                        tracing::warn!(error = %e, "could not store the key set");
                    }
                });
                // ±20% around the interval.
                self.next_directory = Instant::now() + jittered(interval.mul_f64(0.8), 0.5);
                self.top_up();
                self.publish_status();
            }
            Err(e) => {
                self.shared.metrics.cp("directory", false);
                self.directory_failures += 1;
                let wait = backoff(self.directory_failures, Duration::from_secs(2), interval);
                tracing::warn!(error = %e, retry_in = ?wait, "directory fetch failed");
                self.next_directory = Instant::now() + wait;
            }
        }
    }

    /// Tells call tasks which routers we hold and which of them are leaving
    /// (see `Shared::held`, `Shared::leaving`).
    fn sync_held(&self) {
        let same = {
            let held = self.shared.held.read();
            held.len() == self.slots.len() && self.slots.keys().all(|p| held.contains(p))
        };
        if !same {
            *self.shared.held.write() = self.slots.keys().copied().collect();
        }
        let leaving = self
            .slots
            .iter()
            .filter(|(_, s)| s.leaving.is_some())
            .map(|(p, _)| *p);
        let same = {
            let known = self.shared.leaving.read();
            let mut n = 0;
            let all = leaving.clone().all(|p| {
                n += 1;
                known.contains(&p)
            });
            all && n == known.len()
        };
        if !same {
            *self.shared.leaving.write() = leaving.collect();
        }
    }

    /// Remembers what just went wrong with `router` for the status (the
    /// last one only, at most [`MAX_ERROR_CHARS`]); shown from the next
    /// status change on.
    pub(super) fn note_error(&mut self, router: PeerId, what: impl std::fmt::Display) {
        let mut text = format!("router {router}: {what}");
        if text.len() > MAX_ERROR_CHARS {
            let mut end = MAX_ERROR_CHARS;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        self.last_router_error = Some(text);
    }

    /// Recomputes readiness and the status watch from the slots.
    fn publish_status(&mut self) {
        self.sync_held();
        let s = self.status_snapshot();
        let m = &self.shared.metrics;
        m.routers_attached.set(s.reserved.len() as i64);
        m.routers_wanted.set(s.routers_wanted as i64);
        m.router_candidates.set(s.candidates as i64);
        m.ready.set(i64::from(s.ready));
        let ready = s.ready;
        self.shared
            .ready
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
        self.shared.status.send_if_modified(|old| {
            if *old == s {
                false
            } else {
                *old = s;
                true
            }
        });
    }
}
