//! The control-plane client used by routers and members, with retries bounded
//! by time.
//!
//! Every idempotent call retries on `RESOURCE_EXHAUSTED`, `UNAVAILABLE` and
//! `DEADLINE_EXCEEDED` (including a per-attempt timeout). The admin calls
//! that are not idempotent (`CreateToken`, `RotateKeyNow`) retry only when
//! the server certainly did not act ([`is_retryable_unsent`]): a second
//! attempt after a lost answer would mint a token nobody sees or rotate
//! twice; sent with a request id (`create_token_once`,
//! `rotate_key_now_once`, and `apply_policy_once`, `revoke_node_once`,
//! `revoke_token_once`, whose retries would otherwise answer differently)
//! they are retried like idempotent calls, the control plane answering a
//! retry with the first answer. A retry waits the
//! server's `retry-after` plus up to one second of random jitter (the server
//! spreads a refused fleet over whole-second slots; the jitter spreads each
//! slot's callers across its second), or, when there is no `retry-after`, an
//! exponential backoff from 200 ms to 10 s plus up to half of it, so a fleet
//! that was refused together does not come back together. The whole call is bounded by
//! [`ClientConfig::retry_budget`]: the last wait is cut short to end at the
//! budget, the attempt made there is the last one, and its refusal is returned
//! as [`ClientError::BudgetExhausted`]. Proofs of possession are made afresh
//! for every attempt.
//!
//! Over several replicas (`endpoints`): calls stay on one endpoint and move
//! on, at once while an untried one is left, when it gives no answer; each
//! watch is placed by the client's own rotation, and a replica that said it
//! is stopping is avoided for a while ([`STOPPING_AVOID`]; see `watch` for
//! the move statuses).
//!
//! This module compiles without the `server` feature: no SQLite, no axum.

mod admin;
mod endpoints;
mod policy;
mod resolve;
mod retry;
mod watch;

use std::{sync::Arc, time::Duration};

use agentmesh_proto::{
    identity::{Keypair, PeerId},
    pb::{
        controlplane::{
            CreateTokenRequest, CreateTokenResponse, EnrollRequest, EnrollResponse,
            GetDirectoryRequest, GetDirectoryResponse, GetKeysRequest, RefreshRequest,
            RefreshResponse, RevokeNodeRequest, RevokeNodeResponse, RotateKeyNowRequest,
            RotateKeyNowResponse, RouterLeaseRequest, RouterLeaseResponse, RouterLoad,
            control_plane_client::ControlPlaneClient,
        },
        credential::{Credential, KeySet, Label},
    },
    proof::{Bound, normalize_url},
    unix_now,
};
use tonic::{
    Request, Status,
    metadata::MetadataValue,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
};

pub use admin::{REQUEST_ID_METADATA, new_request_id};
pub use endpoints::STOPPING_AVOID;
pub use resolve::RESOLVE_EVERY;
pub use retry::{
    INITIAL_BACKOFF, MAX_BACKOFF, RETRY_AFTER_JITTER, RETRY_AFTER_METADATA, is_retryable,
    is_retryable_unsent, jitter_bound, retry_after,
};
pub use watch::{MOVE_JITTER_MAX, WATCH_MOVE_METADATA, WatchMove, Watching, move_jitter};

use crate::clock::{SharedClock, TokioClock};
use endpoints::Endpoints;
use resolve::Source;

/// Default for [`ClientConfig::retry_budget`]: 180 s.
pub const DEFAULT_RETRY_BUDGET: Duration = Duration::from_secs(180);
/// Default for [`ClientConfig::rpc_timeout`]: 10 s.
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// Default for [`ClientConfig::url`].
pub const DEFAULT_URL: &str = "http://127.0.0.1:7400";

/// Where the control plane is and how long to keep trying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// The control plane's gRPC URL, `http://127.0.0.1:7400` or
    /// `https://host:7400`. It is also the endpoint string proofs sign, so it
    /// must match the server's `--public-url`. Default `http://127.0.0.1:7400`.
    pub url: String,
    /// PEM CA certificate(s) to trust for `https` URLs. `None` with an `https`
    /// URL is a configuration error. Ignored for `http`. Default `None`.
    pub ca_pem: Option<Vec<u8>>,
    /// Time bound on one call including all its retries. Default 180 s.
    pub retry_budget: Duration,
    /// Deadline of one attempt (connect plus answer). Default 10 s.
    pub rpc_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            url: DEFAULT_URL.to_string(),
            ca_pem: None,
            retry_budget: DEFAULT_RETRY_BUDGET,
            rpc_timeout: DEFAULT_RPC_TIMEOUT,
        }
    }
}

/// The policy copy a caller holds (see [`Client::get_directory_holding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldPolicyVersion {
    /// Its epoch.
    pub epoch: u64,
    /// Its version.
    pub version: u64,
}

/// Whether a call may be repeated after an ambiguous outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Idempotency {
    /// Doing it twice is the same as once (reads, Enroll, Refresh, leases,
    /// RevokeNode, RevokeToken, opening a Watch): retry whatever [`is_retryable`] allows.
    Idempotent,
    /// Doing it twice does more (a second token, a second key): retry only
    /// what [`is_retryable_unsent`] allows.
    NotIdempotent,
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Non-retryable refusal (UNAUTHENTICATED, INVALID_ARGUMENT, PERMISSION_DENIED, ...),
    /// or an ambiguous outcome (a deadline, a reset) of a call that is not idempotent.
    #[error("control plane refused: {0}")]
    Refused(tonic::Status),
    /// Retry budget spent; carries the last refusal.
    #[error(
        "control plane retry budget spent after {attempts} attempts in {elapsed:?}; last: {last}"
    )]
    BudgetExhausted {
        /// The last retryable refusal (or timeout) seen.
        last: tonic::Status,
        /// Attempts made.
        attempts: u32,
        /// Time spent, on the client's clock.
        elapsed: Duration,
    },
    /// The client configuration is unusable (bad URL, https without CA, ...).
    #[error("control plane client configuration: {0}")]
    Config(String),
}

impl ClientError {
    /// The gRPC status behind this error, if any.
    pub fn status(&self) -> Option<&tonic::Status> {
        match self {
            Self::Refused(s) | Self::BudgetExhausted { last: s, .. } => Some(s),
            Self::Config(_) => None,
        }
    }
}

/// Default HTTP/2 keep-alive ping interval on the client's connection
/// while a call (or a stream) is open: with [`KEEPALIVE_TIMEOUT`], a
/// router notices a half-open connection to a replica (a host gone, a
/// dropped NAT mapping, a partition) within 10 s and moves its watch and
/// calls to another.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Default time an unanswered keep-alive ping may wait before the
/// connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
// The promise: a half-open connection noticed within 10 s by default.
const _: () = assert!(KEEPALIVE_INTERVAL.as_secs() + KEEPALIVE_TIMEOUT.as_secs() <= 10);

/// How a client dials, beyond its [`ClientConfig`] (kept apart so that
/// struct literals of `ClientConfig` keep compiling as it grows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dialing {
    /// Held connections or one per call. Default [`Connections::Held`].
    pub connections: Connections,
    /// The replicas to dial (`http(s)://host:port` each) instead of the
    /// config's URL, which stays the one logical URL proofs sign and TLS
    /// verifies. Default none: the URL alone.
    pub endpoints: Vec<String>,
    /// HTTP/2 keep-alive ping interval while a call or stream is open.
    /// Default [`KEEPALIVE_INTERVAL`].
    pub keepalive_interval: Duration,
    /// How long a keep-alive ping may go unanswered before the connection
    /// is closed. Default [`KEEPALIVE_TIMEOUT`].
    pub keepalive_timeout: Duration,
    /// The endpoint (an index into `endpoints`) this client's first watch
    /// opens on; each later watch opens on the next. Default `None`: a
    /// random one, so a fleet's watches spread over the replicas.
    pub watch_start: Option<usize>,
}

impl Default for Dialing {
    fn default() -> Self {
        Self {
            connections: Connections::Held,
            endpoints: Vec::new(),
            keepalive_interval: KEEPALIVE_INTERVAL,
            keepalive_timeout: KEEPALIVE_TIMEOUT,
            watch_start: None,
        }
    }
}

/// How a [`Client`] uses connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Connections {
    /// One connection, opened on the first call and kept (reopened after
    /// the control plane closes it): for routers, whose lease renewals and
    /// `Watch` stream keep it busy.
    Held,
    /// A connection for each call, closed when the call ends: for members,
    /// which talk to the control plane a few times an hour. An idle HTTP/2
    /// connection costs the control plane about 39 KB, so a held one per
    /// member would be most of its memory; with this a member at rest
    /// holds none (each call pays a TCP connect, and a TLS handshake on
    /// `https`).
    PerCall,
}

/// A cheap-to-clone control-plane client. Its channel connects lazily, on the
/// first call, and reconnects by itself.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// Deadline of one attempt: the config's `rpc_timeout`, or less for a
    /// client made by [`Client::with_attempt_timeout`].
    rpc_timeout: Duration,
}

struct Inner {
    url: String,
    /// Where calls go: the URL itself, or the replicas' own addresses
    /// ([`Client::with_endpoints`]), and which one each call uses.
    endpoints: Endpoints,
    connections: Connections,
    retry_budget: Duration,
    clock: SharedClock,
}

/// A call's answer, with the endpoint that gave it and the attempts made.
struct Answered<T> {
    answer: T,
    endpoint: usize,
    attempts: u32,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("url", &self.inner.url)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client for `cfg.url`. Does no I/O; the channel connects on first use.
    pub fn new(cfg: ClientConfig) -> Result<Self, ClientError> {
        Self::with_clock(cfg, TokioClock::shared())
    }

    /// Like [`Client::new`], with the given use of connections.
    pub fn with_connections(
        cfg: ClientConfig,
        connections: Connections,
    ) -> Result<Self, ClientError> {
        let dialing = Dialing {
            connections,
            ..Dialing::default()
        };
        Self::build(cfg, TokioClock::shared(), dialing)
    }

    /// Like [`Client::new`], with the clock that times backoff and the retry
    /// budget (tests share a simulated clock with the server's limiter).
    pub fn with_clock(cfg: ClientConfig, clock: SharedClock) -> Result<Self, ClientError> {
        Self::build(cfg, clock, Dialing::default())
    }

    /// Like [`Client::with_connections`], dialling `endpoints` (the
    /// control plane's replicas, `http(s)://host:port` each) instead of
    /// `cfg.url`, which stays the one logical URL proofs sign and TLS
    /// verifies the server's name against. A call starts on the endpoint
    /// the last one ended on; an attempt that gets no answer (a refused or
    /// lost connection, `UNAVAILABLE` without `retry-after`, a deadline)
    /// moves it to the next, so a retry never goes back to the replica that
    /// just timed out while another is untried (a frozen replica keeps its
    /// TCP connections open), and goes there at once, without a backoff,
    /// while this call has not tried every endpoint. Empty: `cfg.url`
    /// alone.
    pub fn with_endpoints(
        cfg: ClientConfig,
        connections: Connections,
        endpoints: &[String],
    ) -> Result<Self, ClientError> {
        let dialing = Dialing {
            connections,
            endpoints: endpoints.to_vec(),
            ..Dialing::default()
        };
        Self::build(cfg, TokioClock::shared(), dialing)
    }

    /// Like [`Client::with_endpoints`], with every dialing choice given
    /// (keep-alive, where watches start).
    pub fn with_dialing(cfg: ClientConfig, dialing: Dialing) -> Result<Self, ClientError> {
        Self::build(cfg, TokioClock::shared(), dialing)
    }

    fn build(cfg: ClientConfig, clock: SharedClock, dialing: Dialing) -> Result<Self, ClientError> {
        let url = normalize_url(cfg.url.trim()).to_string();
        if cfg.retry_budget.is_zero() || cfg.rpc_timeout.is_zero() {
            return Err(ClientError::Config(
                "retry budget and rpc timeout must be positive".into(),
            ));
        }
        if dialing.keepalive_interval.is_zero() || dialing.keepalive_timeout.is_zero() {
            return Err(ClientError::Config(
                "keep-alive interval and timeout must be positive".into(),
            ));
        }
        let sources: Vec<Source> = if dialing.endpoints.is_empty() {
            vec![Source::Fixed(url.clone())]
        } else {
            dialing
                .endpoints
                .iter()
                .map(|e| Source::parse(normalize_url(e.trim())).map_err(ClientError::Config))
                .collect::<Result<_, _>>()?
        };
        let make = {
            let (url, cfg, dialing) = (url.clone(), cfg.clone(), dialing.clone());
            Box::new(move |address: &str| dial_endpoint(address, &url, &cfg, &dialing))
        };
        let endpoints = Endpoints::new(sources, make, dialing.watch_start)?;
        Ok(Self {
            inner: Arc::new(Inner {
                url,
                endpoints,
                connections: dialing.connections,
                retry_budget: cfg.retry_budget,
                clock,
            }),
            rpc_timeout: cfg.rpc_timeout,
        })
    }

    /// This client (the same endpoints, connections and retry budget) with
    /// each attempt ending within `attempt` (at most the configured rpc
    /// timeout): for a call that must not wait a whole rpc timeout on one
    /// frozen replica before it tries the next, as a router's lease, which
    /// must land within its TTL.
    pub fn with_attempt_timeout(&self, attempt: Duration) -> Self {
        Self {
            inner: self.inner.clone(),
            rpc_timeout: attempt.min(self.rpc_timeout).max(Duration::from_millis(1)),
        }
    }

    /// The deadline of one attempt.
    pub fn attempt_timeout(&self) -> Duration {
        self.rpc_timeout
    }

    /// The client's clock now.
    fn now(&self) -> Duration {
        self.inner.clock.now()
    }
}

/// Whether an attempt's failure says the endpoint did not answer (so the
/// next attempt should go elsewhere), rather than that it answered no.
fn endpoint_failed(status: &Status) -> bool {
    match status.code() {
        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled | tonic::Code::Unknown => true,
        tonic::Code::Unavailable => retry_after(status).is_none(),
        _ => false,
    }
}

/// The tonic endpoint dialling `address` for the control plane whose
/// logical URL is `url` (the name TLS verifies).
fn dial_endpoint(
    address: &str,
    url: &str,
    cfg: &ClientConfig,
    dialing: &Dialing,
) -> Result<Endpoint, ClientError> {
    let mut endpoint = Endpoint::from_shared(address.to_string())
        .map_err(|e| ClientError::Config(format!("bad url {address:?}: {e}")))?
        .connect_timeout(cfg.rpc_timeout)
        .timeout(cfg.rpc_timeout)
        // A stream held open (a router's `Watch`) learns that the control
        // plane is gone within interval + timeout. Only while a call is
        // open: an idle member's connection sends nothing and is closed
        // by the control plane's connection age as before.
        .http2_keep_alive_interval(dialing.keepalive_interval)
        .keep_alive_timeout(dialing.keepalive_timeout)
        .keep_alive_while_idle(false);
    if !url.starts_with("http://") && !url.starts_with("https://") {
        return Err(ClientError::Config(format!(
            "url {url:?} must start with http:// or https://"
        )));
    }
    if address.starts_with("https://") {
        let pem = cfg.ca_pem.as_ref().ok_or_else(|| {
            ClientError::Config(format!(
                "{address} is https but no CA certificate was given"
            ))
        })?;
        crate::tls::ensure_crypto_provider();
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
        if let Some(host) = host_of(url) {
            tls = tls.domain_name(host);
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| ClientError::Config(format!("tls for {address}: {e}")))?;
    } else if !address.starts_with("http://") {
        return Err(ClientError::Config(format!(
            "url {address:?} must start with http:// or https://"
        )));
    }
    Ok(endpoint)
}

/// The host of `url` (`https://host:port/…` → `host`), without IPv6
/// brackets.
fn host_of(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    (!host.is_empty()).then(|| host.to_string())
}

impl Client {
    /// The endpoint string proofs sign (the URL without a trailing slash).
    pub fn public_url(&self) -> &str {
        &self.inner.url
    }

    /// The addresses dialled now, in order: the endpoints given, a
    /// `dns+` name as the addresses it last resolved to (the name itself
    /// before its first answer).
    pub fn endpoints(&self) -> Vec<String> {
        self.inner.endpoints.addresses()
    }

    /// A stub for endpoint `i` on its held channel, or on a channel of its
    /// own that closes its connection when the call's last clone of it is
    /// dropped.
    fn grpc_at(&self, i: usize) -> ControlPlaneClient<Channel> {
        let dial = self.inner.endpoints.get(i);
        let ch = match self.inner.connections {
            Connections::Held => dial
                .channel
                .get_or_init(|| dial.endpoint.connect_lazy())
                .clone(),
            Connections::PerCall => dial.endpoint.connect_lazy(),
        };
        ControlPlaneClient::new(ch)
    }

    fn request<T>(&self, msg: T) -> Request<T> {
        let mut r = Request::new(msg);
        r.set_timeout(self.rpc_timeout);
        r
    }

    fn admin_request<T>(
        &self,
        msg: T,
        bearer: &MetadataValue<tonic::metadata::Ascii>,
    ) -> Request<T> {
        let mut r = self.request(msg);
        r.metadata_mut().insert("authorization", bearer.clone());
        r
    }

    /// Exchanges a token and a proof of possession of `key` for a credential.
    pub async fn enroll(&self, token: &str, key: &Keypair) -> Result<EnrollResponse, ClientError> {
        self.retrying("Enroll", Idempotency::Idempotent, |mut c| {
            let req = self.request(
                EnrollRequest {
                    token: token.to_string(),
                    proof: None,
                }
                .proven(self.public_url(), key, unix_now()),
            );
            async move { c.enroll(req).await }
        })
        .await
    }

    /// Exchanges a current (or just-expired) credential for a new one.
    pub async fn refresh(
        &self,
        cred: &Credential,
        key: &Keypair,
    ) -> Result<RefreshResponse, ClientError> {
        self.retrying("Refresh", Idempotency::Idempotent, |mut c| {
            let req = self.request(
                RefreshRequest {
                    credential: Some(cred.clone()),
                    proof: None,
                }
                .proven(self.public_url(), key, unix_now()),
            );
            async move { c.refresh(req).await }
        })
        .await
    }

    /// The control plane's current signing keys.
    pub async fn get_keys(&self) -> Result<KeySet, ClientError> {
        let resp = self
            .retrying("GetKeys", Idempotency::Idempotent, |mut c| {
                let req = self.request(GetKeysRequest {});
                async move { c.get_keys(req).await }
            })
            .await?;
        Ok(resp.keys.unwrap_or_default())
    }

    /// Live routers, the revocation list and the signed policy in force.
    pub async fn get_directory(&self) -> Result<GetDirectoryResponse, ClientError> {
        self.get_directory_holding(None).await
    }

    /// As [`Client::get_directory`], saying which policy the caller holds:
    /// when it is the copy in force the answer carries no policy and sets
    /// `policy_unchanged` (a control plane that predates this sends the
    /// policy anyway).
    pub async fn get_directory_holding(
        &self,
        held: Option<&HeldPolicyVersion>,
    ) -> Result<GetDirectoryResponse, ClientError> {
        let msg = held.map_or_else(GetDirectoryRequest::default, |h| GetDirectoryRequest {
            policy_epoch: h.epoch,
            policy_version: h.version,
        });
        self.retrying("GetDirectory", Idempotency::Idempotent, |mut c| {
            let req = self.request(msg);
            async move { c.get_directory(req).await }
        })
        .await
    }

    /// A router's heartbeat: its addresses, labels (a subset of its
    /// credential's), load and draining flag.
    pub async fn router_lease(
        &self,
        cred: &Credential,
        key: &Keypair,
        addrs: Vec<String>,
        labels: Vec<Label>,
        load: RouterLoad,
        draining: bool,
    ) -> Result<RouterLeaseResponse, ClientError> {
        self.retrying("RouterLease", Idempotency::Idempotent, |mut c| {
            let req = self.request(
                RouterLeaseRequest {
                    credential: Some(cred.clone()),
                    proof: None,
                    addrs: addrs.clone(),
                    labels: labels.clone(),
                    load: Some(load),
                    draining,
                }
                .proven(self.public_url(), key, unix_now()),
            );
            async move { c.router_lease(req).await }
        })
        .await
    }

    /// Admin: mints a token; the response carries it once.
    pub async fn create_token(
        &self,
        admin_token: &str,
        req: CreateTokenRequest,
    ) -> Result<CreateTokenResponse, ClientError> {
        let bearer = bearer(admin_token)?;
        self.retrying("CreateToken", Idempotency::NotIdempotent, |mut c| {
            let r = self.admin_request(req.clone(), &bearer);
            async move { c.create_token(r).await }
        })
        .await
    }

    /// Admin: revokes `peer` until its last credential expires.
    pub async fn revoke_node(
        &self,
        admin_token: &str,
        peer: &PeerId,
        reason: &str,
    ) -> Result<RevokeNodeResponse, ClientError> {
        let bearer = bearer(admin_token)?;
        self.retrying("RevokeNode", Idempotency::Idempotent, |mut c| {
            let r = self.admin_request(
                RevokeNodeRequest {
                    peer_id: peer.to_bytes(),
                    reason: reason.to_string(),
                },
                &bearer,
            );
            async move { c.revoke_node(r).await }
        })
        .await
    }

    /// Admin: starts a key rotation now (the new key is published before it signs).
    pub async fn rotate_key_now(
        &self,
        admin_token: &str,
    ) -> Result<RotateKeyNowResponse, ClientError> {
        let bearer = bearer(admin_token)?;
        self.retrying("RotateKeyNow", Idempotency::NotIdempotent, |mut c| {
            let r = self.admin_request(RotateKeyNowRequest {}, &bearer);
            async move { c.rotate_key_now(r).await }
        })
        .await
    }

    /// Runs `attempt` (given a stub for the endpoint to try) until it
    /// succeeds, is refused for good, or the budget is spent; starts on the
    /// endpoint unary calls use now.
    async fn retrying<T, F, Fut>(
        &self,
        method: &'static str,
        idempotency: Idempotency,
        attempt: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(ControlPlaneClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.inner.endpoints.refresh(self.now()).await;
        let first = self.inner.endpoints.for_call(self.now());
        let a = self
            .retrying_from(method, idempotency, first, attempt)
            .await?;
        Ok(a.answer)
    }

    /// [`Client::retrying`] starting on endpoint `first`; the answer comes
    /// with the endpoint that gave it and the attempts it took.
    async fn retrying_from<T, F, Fut>(
        &self,
        method: &'static str,
        idempotency: Idempotency,
        first: usize,
        mut attempt: F,
    ) -> Result<Answered<T>, ClientError>
    where
        F: FnMut(ControlPlaneClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let clock = &self.inner.clock;
        let budget = self.inner.retry_budget;
        let start = clock.now();
        let (mut attempts, mut at) = (0u32, first);
        // Endpoints moved past since the last wait: another one not tried
        // yet is tried at once.
        let mut moved = 0;
        let mut backoff = INITIAL_BACKOFF;
        let retryable = match idempotency {
            Idempotency::Idempotent => is_retryable,
            Idempotency::NotIdempotent => is_retryable_unsent,
        };
        loop {
            attempts = attempts.saturating_add(1);
            let call = attempt(self.grpc_at(at));
            let status = match tokio::time::timeout(self.rpc_timeout, call).await {
                Ok(Ok(resp)) => {
                    return Ok(Answered {
                        answer: resp.into_inner(),
                        endpoint: at,
                        attempts,
                    });
                }
                Ok(Err(status)) => status,
                Err(_) => Status::deadline_exceeded(format!(
                    "{method}: no answer from {} within {:?}",
                    self.inner.endpoints.get(at).address,
                    self.rpc_timeout
                )),
            };
            let elsewhere = endpoint_failed(&status);
            if elsewhere {
                at = self.inner.endpoints.after_failure(at, clock.now());
            }
            if !retryable(&status) {
                return Err(ClientError::Refused(status));
            }
            let elapsed = clock.now().saturating_sub(start);
            let remaining = budget.saturating_sub(elapsed);
            if remaining.is_zero() {
                tracing::debug!(method, attempts, ?elapsed, code = ?status.code(), "control plane retry budget spent");
                return Err(ClientError::BudgetExhausted {
                    last: status,
                    attempts,
                    elapsed,
                });
            }
            if elsewhere && moved + 1 < self.inner.endpoints.len() {
                moved += 1;
                tracing::debug!(method, attempts, code = ?status.code(), msg = status.message(), "control plane call goes to the next endpoint at once");
                continue;
            }
            moved = 0;
            let (wait, from_server) = retry::next_wait(&status, backoff);
            if !from_server {
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            let wait = wait.min(remaining);
            tracing::debug!(method, attempts, ?wait, code = ?status.code(), msg = status.message(), "control plane call will retry");
            clock.sleep(wait).await;
        }
    }
}

fn bearer(admin_token: &str) -> Result<MetadataValue<tonic::metadata::Ascii>, ClientError> {
    MetadataValue::try_from(format!("Bearer {}", admin_token.trim()))
        .map_err(|_| ClientError::Config("admin token is not printable ASCII".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_logical_host_is_what_tls_verifies() {
        assert_eq!(
            host_of("https://cp.example:7400").as_deref(),
            Some("cp.example")
        );
        assert_eq!(host_of("https://cp.example").as_deref(), Some("cp.example"));
        assert_eq!(host_of("https://[::1]:7400/").as_deref(), Some("::1"));
        assert_eq!(host_of("nonsense"), None);
        // Several endpoints under one logical URL, each checked.
        let c = Client::with_endpoints(
            ClientConfig {
                url: "http://cp.example:7400".into(),
                ..ClientConfig::default()
            },
            Connections::PerCall,
            &[
                "http://10.0.0.1:7400".into(),
                "http://10.0.0.2:7400/".into(),
            ],
        )
        .expect("valid");
        assert_eq!(c.public_url(), "http://cp.example:7400");
        assert!(matches!(
            Client::with_endpoints(
                ClientConfig::default(),
                Connections::PerCall,
                &["ftp://x".into()]
            ),
            Err(ClientError::Config(_))
        ));
    }

    #[test]
    fn config_errors_are_clear() {
        let https = ClientConfig {
            url: "https://cp.example:7400".into(),
            ..ClientConfig::default()
        };
        assert!(matches!(Client::new(https), Err(ClientError::Config(m)) if m.contains("no CA")));
        let bad = ClientConfig {
            url: "ftp://x".into(),
            ..ClientConfig::default()
        };
        assert!(matches!(Client::new(bad), Err(ClientError::Config(_))));
        let ok = Client::new(ClientConfig {
            url: "http://127.0.0.1:7400/".into(),
            ..ClientConfig::default()
        })
        .expect("valid config");
        assert_eq!(ok.public_url(), "http://127.0.0.1:7400");
    }

    use crate::clock::SkipClock;

    #[tokio::test]
    async fn unreachable_server_spends_the_budget_then_reports_the_last_status() {
        // Nothing listens on port 1; every attempt is UNAVAILABLE.
        let clock = Arc::new(SkipClock::default());
        let c = Client::with_clock(
            ClientConfig {
                url: "http://127.0.0.1:1".into(),
                retry_budget: Duration::from_secs(30),
                rpc_timeout: Duration::from_secs(10),
                ca_pem: None,
            },
            clock.clone(),
        )
        .expect("valid config");
        match c.get_keys().await {
            Err(ClientError::BudgetExhausted { last, attempts, .. }) => {
                assert!(attempts >= 3, "retried: {attempts}");
                // The last wait was cut to end exactly at the budget.
                assert_eq!(crate::clock::Clock::now(&*clock), Duration::from_secs(30));
                assert!(
                    matches!(
                        last.code(),
                        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                    ),
                    "{last:?}"
                );
            }
            other => panic!("expected BudgetExhausted, got {other:?}"),
        }
    }

    /// A listener that accepts connections and never answers: every call
    /// sent there has an ambiguous outcome (it may have been acted on).
    async fn black_hole() -> (String, tokio::task::JoinHandle<()>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", l.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = l.accept().await {
                held.push(s);
            }
        });
        (url, task)
    }

    fn skip_client(url: &str, budget_secs: u64) -> Client {
        Client::with_clock(
            ClientConfig {
                url: url.into(),
                retry_budget: Duration::from_secs(budget_secs),
                rpc_timeout: Duration::from_secs(1),
                ca_pem: None,
            },
            Arc::new(SkipClock::default()),
        )
        .expect("valid config")
    }

    #[tokio::test]
    async fn a_create_token_without_an_answer_is_not_sent_twice() {
        let (url, task) = black_hole().await;
        let deadline = Duration::from_secs(60);
        let c = skip_client(&url, 30);
        let r = tokio::time::timeout(
            deadline,
            c.create_token("admin-token-0123456789", CreateTokenRequest::default()),
        )
        .await
        .expect("returns within the deadline");
        match r {
            Err(ClientError::Refused(s)) => assert!(
                matches!(
                    s.code(),
                    tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
                ),
                "{s:?}"
            ),
            other => panic!("expected one attempt and its refusal, got {other:?}"),
        }
        let r = tokio::time::timeout(deadline, c.rotate_key_now("admin-token-0123456789"))
            .await
            .expect("returns within the deadline");
        assert!(matches!(r, Err(ClientError::Refused(_))), "{r:?}");
        // An idempotent call to the same place keeps retrying until its budget.
        let r = tokio::time::timeout(deadline, skip_client(&url, 2).get_keys())
            .await
            .expect("returns within the deadline");
        assert!(
            matches!(r, Err(ClientError::BudgetExhausted { attempts, .. }) if attempts >= 2),
            "{r:?}"
        );
        task.abort();
    }

    #[tokio::test]
    async fn a_create_token_that_never_connected_is_retried() {
        // Nothing listens on port 1: the request is never sent, so retrying is safe.
        let c = skip_client("http://127.0.0.1:1", 5);
        match c
            .create_token("admin-token-0123456789", CreateTokenRequest::default())
            .await
        {
            Err(ClientError::BudgetExhausted { attempts, last, .. }) => {
                assert!(attempts >= 2, "retried: {attempts}");
                assert_eq!(last.code(), tonic::Code::Unavailable, "{last:?}");
            }
            other => panic!("expected retries until the budget, got {other:?}"),
        }
    }
}
