//! Floods of the control plane's unauthenticated RPCs from one source
//! address: what a host without a credential can send before any of its
//! requests is checked.
//!
//! [`flood`] sends requests at a fixed rate for a bounded time from a local
//! address the caller picks (any `127.x.y.z` is local on Linux loopback, so
//! a test can make the attacker a source apart from the real members), on a
//! few HTTP/2 connections, with a bound on requests in flight; a request
//! that would exceed the bound is not sent and is counted as skipped, so
//! the flood never queues without bound in the attacker either. It returns
//! what the control plane answered, by status code and by the limiter a
//! `RESOURCE_EXHAUSTED` names, so a test can check both that the attack ran
//! and that each refusal came from the limit meant to stop it.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use agentmesh_proto::{
    identity::Keypair,
    pb::{
        controlplane::{
            EnrollRequest, GetDirectoryRequest, GetKeysRequest, ProofOfPossession, RefreshRequest,
            RouterLeaseRequest, control_plane_client::ControlPlaneClient,
        },
        credential::Credential,
    },
    proof::Bound,
    unix_now,
};
use rand::RngCore;
use tokio::{sync::Semaphore, task::JoinSet, time::MissedTickBehavior};
use tonic::transport::{Channel, Endpoint};

/// One kind of request the flood sends; [`FloodConfig::kinds`] is cycled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FloodKind {
    /// `Refresh` with no credential and no proof: refused at decode.
    EmptyRefresh,
    /// `Refresh` with random bytes for a credential and a proof whose
    /// public key does not decode.
    GarbageRefresh,
    /// `RouterLease` with no credential and no proof.
    EmptyLease,
    /// `Enroll` with a token that does not exist and a valid proof from a
    /// fresh key: passes every check before the token lookup.
    BadEnroll,
    /// `GetKeys` (unauthenticated by design).
    GetKeys,
    /// `GetDirectory` (unauthenticated by design).
    GetDirectory,
}

impl FloodKind {
    /// Every kind, for the command line.
    pub const ALL: [FloodKind; 6] = [
        FloodKind::EmptyRefresh,
        FloodKind::GarbageRefresh,
        FloodKind::EmptyLease,
        FloodKind::BadEnroll,
        FloodKind::GetKeys,
        FloodKind::GetDirectory,
    ];

    /// The kind's name on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            FloodKind::EmptyRefresh => "empty-refresh",
            FloodKind::GarbageRefresh => "garbage-refresh",
            FloodKind::EmptyLease => "empty-lease",
            FloodKind::BadEnroll => "bad-enroll",
            FloodKind::GetKeys => "get-keys",
            FloodKind::GetDirectory => "get-directory",
        }
    }

    /// The kind named `s` (see [`FloodKind::as_str`]).
    pub fn parse(s: &str) -> Option<FloodKind> {
        FloodKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// What to send, from where, how fast and for how long.
#[derive(Debug, Clone)]
pub struct FloodConfig {
    /// The control plane's gRPC URL (`http://host:port`); also the
    /// endpoint string the bad enrollments' proofs sign.
    pub url: String,
    /// Local address every connection is bound to (the attacking source).
    pub source: IpAddr,
    /// Requests sent per second, over all connections.
    pub rate_per_sec: u32,
    /// How long to send.
    pub duration: Duration,
    /// The kinds sent, in turn.
    pub kinds: Vec<FloodKind>,
    /// HTTP/2 connections the requests are spread over.
    pub connections: usize,
    /// Requests in flight at most; one more is skipped, not queued.
    pub max_in_flight: usize,
    /// Deadline of one request (and of connecting).
    pub rpc_timeout: Duration,
}

impl FloodConfig {
    /// Empty refreshes from `source` at 1,000/s for `duration`, on two
    /// connections, at most 256 in flight, 5 s per request.
    pub fn new(url: impl Into<String>, source: IpAddr, duration: Duration) -> Self {
        Self {
            url: url.into(),
            source,
            rate_per_sec: 1_000,
            duration,
            kinds: vec![FloodKind::EmptyRefresh],
            connections: 2,
            max_in_flight: 256,
            rpc_timeout: Duration::from_secs(5),
        }
    }
}

/// What one kind of request got back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KindReport {
    /// Requests sent.
    pub sent: u64,
    /// Answered OK.
    pub ok: u64,
    /// Refused, by gRPC code (`ResourceExhausted`, `InvalidArgument`, …).
    pub by_code: BTreeMap<String, u64>,
    /// `RESOURCE_EXHAUSTED` refusals by the limiter their message names
    /// (the first word: `failure_guard`, `refresh`, …).
    pub by_limiter: BTreeMap<String, u64>,
    /// Refusals that carried `retry-after`.
    pub with_retry_after: u64,
}

/// What a flood did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FloodReport {
    /// By kind.
    pub kinds: BTreeMap<FloodKind, KindReport>,
    /// Requests not sent because `max_in_flight` were outstanding.
    pub skipped: u64,
    /// Connections that could not be opened (the flood then sends on the
    /// others; with none it returns at once).
    pub connect_failures: u64,
}

impl FloodReport {
    /// Requests sent, all kinds.
    pub fn sent(&self) -> u64 {
        self.kinds.values().map(|k| k.sent).sum()
    }

    /// Requests answered OK, all kinds.
    pub fn ok(&self) -> u64 {
        self.kinds.values().map(|k| k.ok).sum()
    }

    /// Refusals naming `limiter`, all kinds.
    pub fn refused_by(&self, limiter: &str) -> u64 {
        self.kinds
            .values()
            .filter_map(|k| k.by_limiter.get(limiter))
            .sum()
    }

    /// Refusals with gRPC code `code` (its `Debug` name), all kinds.
    pub fn refused_with(&self, code: &str) -> u64 {
        self.kinds
            .values()
            .filter_map(|k| k.by_code.get(code))
            .sum()
    }

    /// The totals, and refusals by gRPC code (`code:…`) and by limiter
    /// (`limiter:…`), for `--json`.
    pub fn counts(&self) -> crate::summary::Summary {
        let mut s = crate::summary::Summary::new(
            "control-plane-flood",
            [
                ("sent", self.sent()),
                ("ok", self.ok()),
                ("refused", self.sent().saturating_sub(self.ok())),
                ("skipped", self.skipped),
                ("connect_failures", self.connect_failures),
                (
                    "with_retry_after",
                    self.kinds.values().map(|k| k.with_retry_after).sum(),
                ),
            ],
        );
        for k in self.kinds.values() {
            let codes = k.by_code.iter().map(|(c, n)| (format!("code:{c}"), *n));
            let limiters = k
                .by_limiter
                .iter()
                .map(|(l, n)| (format!("limiter:{l}"), *n));
            for (key, n) in codes.chain(limiters) {
                *s.counts.entry(key).or_default() += n;
            }
        }
        s
    }

    /// One line per kind, for logs and the command line.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "sent {} ok {} skipped {} connect_failures {}\n",
            self.sent(),
            self.ok(),
            self.skipped,
            self.connect_failures
        );
        for (kind, r) in &self.kinds {
            out.push_str(&format!(
                "  {}: sent {} ok {} codes {:?} limiters {:?} retry-after {}\n",
                kind.as_str(),
                r.sent,
                r.ok,
                r.by_code,
                r.by_limiter,
                r.with_retry_after
            ));
        }
        out
    }
}

async fn connect(cfg: &FloodConfig) -> anyhow::Result<Channel> {
    let ch = Endpoint::from_shared(cfg.url.clone())?
        .local_address(Some(cfg.source))
        .connect_timeout(cfg.rpc_timeout)
        .timeout(cfg.rpc_timeout)
        .connect()
        .await?;
    Ok(ch)
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    rand::thread_rng().fill_bytes(&mut b);
    b
}

/// Sends one request of `kind`; the answer as OK or its status.
async fn send(
    mut client: ControlPlaneClient<Channel>,
    kind: FloodKind,
    url: &str,
    enroll_key: &Keypair,
) -> Result<(), tonic::Status> {
    match kind {
        FloodKind::EmptyRefresh => client.refresh(RefreshRequest::default()).await.map(drop),
        FloodKind::GarbageRefresh => client
            .refresh(RefreshRequest {
                credential: Some(Credential {
                    claims: random_bytes(96),
                    signature: random_bytes(64),
                }),
                proof: Some(ProofOfPossession {
                    public_key: random_bytes(36),
                    timestamp_unix_secs: unix_now(),
                    signature: random_bytes(64),
                }),
            })
            .await
            .map(drop),
        FloodKind::EmptyLease => client
            .router_lease(RouterLeaseRequest::default())
            .await
            .map(drop),
        FloodKind::BadEnroll => client
            .enroll(
                EnrollRequest {
                    token: format!("amt_hostile_{}", hex_of(&random_bytes(8))),
                    proof: None,
                }
                .proven(url, enroll_key, unix_now()),
            )
            .await
            .map(drop),
        FloodKind::GetKeys => client.get_keys(GetKeysRequest {}).await.map(drop),
        FloodKind::GetDirectory => client
            .get_directory(GetDirectoryRequest::default())
            .await
            .map(drop),
    }
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn record(report: &Mutex<FloodReport>, kind: FloodKind, r: Result<(), tonic::Status>) {
    let mut rep = report.lock().unwrap_or_else(|p| p.into_inner());
    let k = rep.kinds.entry(kind).or_default();
    match r {
        Ok(()) => k.ok += 1,
        Err(s) => {
            *k.by_code.entry(format!("{:?}", s.code())).or_default() += 1;
            if s.code() == tonic::Code::ResourceExhausted {
                let limiter = s
                    .message()
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_string();
                *k.by_limiter.entry(limiter).or_default() += 1;
            }
            if s.metadata().get("retry-after").is_some() {
                k.with_retry_after += 1;
            }
        }
    }
}

/// Runs the flood described by `cfg` and reports what came back. Returns
/// after `cfg.duration` plus at most one `rpc_timeout` for the last
/// requests; an error only if no connection could be opened.
pub async fn flood(cfg: FloodConfig) -> anyhow::Result<FloodReport> {
    flood_until(cfg, std::future::pending()).await
}

/// [`flood`], ending early once `stop` completes (a test stops the attack
/// when the members it watches are done, so they are attacked throughout).
pub async fn flood_until(
    cfg: FloodConfig,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<FloodReport> {
    anyhow::ensure!(!cfg.kinds.is_empty(), "no request kinds to send");
    let report = Arc::new(Mutex::new(FloodReport::default()));
    let mut channels = Vec::new();
    for _ in 0..cfg.connections.max(1) {
        match connect(&cfg).await {
            Ok(ch) => channels.push(ch),
            Err(e) => {
                tracing::debug!(error = %e, "flood connection failed");
                report
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .connect_failures += 1;
            }
        }
    }
    anyhow::ensure!(
        !channels.is_empty(),
        "no connection to {} from {} could be opened",
        cfg.url,
        cfg.source
    );
    let enroll_key = Arc::new(Keypair::generate_ed25519());
    let url: Arc<str> = cfg.url.clone().into();
    let in_flight = Arc::new(Semaphore::new(cfg.max_in_flight.max(1)));
    // Every millisecond (or as often as the runtime wakes us), send what
    // the schedule `rate × elapsed` says is due: a late tick catches up,
    // so the rate holds on a loaded machine, bounded by `max_in_flight`.
    let mut ticker = tokio::time::interval(Duration::from_millis(1));
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let start = tokio::time::Instant::now();
    let end = start + cfg.duration;
    let mut tasks = JoinSet::new();
    let mut n: u64 = 0;
    let budget = u64::from(cfg.rate_per_sec) * cfg.duration.as_millis() as u64 / 1_000;
    tokio::pin!(stop);
    while tokio::time::Instant::now() < end && n < budget.max(1) {
        tokio::select! {
            _ = ticker.tick() => {}
            () = &mut stop => break,
        }
        let due = (u128::from(cfg.rate_per_sec) * start.elapsed().as_millis() / 1_000)
            .min(u128::from(budget.max(1)));
        let due = u64::try_from(due).unwrap_or(u64::MAX);
        while n < due {
            let kind = cfg.kinds[(n % cfg.kinds.len() as u64) as usize];
            let ch = channels[(n % channels.len() as u64) as usize].clone();
            n += 1;
            let Ok(permit) = in_flight.clone().try_acquire_owned() else {
                report.lock().unwrap_or_else(|p| p.into_inner()).skipped += 1;
                continue;
            };
            report
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .kinds
                .entry(kind)
                .or_default()
                .sent += 1;
            let (report, key, url) = (report.clone(), enroll_key.clone(), url.clone());
            let timeout = cfg.rpc_timeout;
            tasks.spawn(async move {
                let r = tokio::time::timeout(
                    timeout,
                    send(ControlPlaneClient::new(ch), kind, &url, &key),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(tonic::Status::deadline_exceeded("flood request timed out"))
                });
                record(&report, kind, r);
                drop(permit);
            });
        }
        // Reap finished tasks so the set stays as small as what is in flight.
        while tasks.try_join_next().is_some() {}
    }
    let drain = tokio::time::timeout(cfg.rpc_timeout + Duration::from_secs(1), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drain.is_err() {
        tasks.abort_all();
    }
    let r = report.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_their_names() {
        for k in FloodKind::ALL {
            assert_eq!(FloodKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(FloodKind::parse("nope"), None);
    }

    #[test]
    fn refusals_are_sorted_by_code_and_limiter() {
        let rep = Mutex::new(FloodReport::default());
        let mut limited = tonic::Status::resource_exhausted("failure_guard limit reached; retry");
        limited.metadata_mut().insert(
            "retry-after",
            tonic::metadata::MetadataValue::from_static("3"),
        );
        record(&rep, FloodKind::EmptyRefresh, Err(limited));
        record(
            &rep,
            FloodKind::EmptyRefresh,
            Err(tonic::Status::invalid_argument("credential missing")),
        );
        record(&rep, FloodKind::GetKeys, Ok(()));
        let rep = rep.into_inner().expect("lock");
        assert_eq!(rep.refused_by("failure_guard"), 1);
        assert_eq!(rep.refused_with("InvalidArgument"), 1);
        assert_eq!(rep.ok(), 1);
        assert_eq!(rep.kinds[&FloodKind::EmptyRefresh].with_retry_after, 1);
        let counts = rep.counts().counts;
        assert_eq!(counts["limiter:failure_guard"], 1);
        assert_eq!(counts["code:InvalidArgument"], 1);
        assert_eq!(counts["code:ResourceExhausted"], 1);
        assert_eq!(counts["with_retry_after"], 1);
    }
}
