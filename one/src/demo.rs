//! Demo members: each exposes an echo service `echo-<i>` and calls a random
//! other member's echo service in a loop, so calls can be seen flowing.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentmesh_node as node;
use parking_lot::Mutex;
use rand::Rng as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Latency samples kept for the percentiles (a ring: newest win).
const LATENCY_SAMPLES: usize = 4096;
/// Bytes each demo call sends and expects back.
const PAYLOAD_BYTES: usize = 64;
/// A demo call that takes longer than this counts as failed.
const CALL_DEADLINE: Duration = Duration::from_secs(15);
/// Most connections the shared echo backend serves at once.
const ECHO_MAX_CONNECTIONS: usize = 1024;

/// What the demo does.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Number of members.
    pub members: usize,
    /// Control plane URL.
    pub control_plane: String,
    /// Member token.
    pub token: String,
    /// Folder under which each member keeps its data dir.
    pub data_dir: PathBuf,
    /// Average pause between one member's calls.
    pub call_interval: Duration,
    /// Routers per member (K).
    pub routers: usize,
}

/// Counters shown on the status line.
#[derive(Debug, Default, Clone)]
pub struct DemoStats {
    /// Members started.
    pub members: usize,
    /// Members ready now.
    pub ready: usize,
    /// Calls that echoed the payload back intact.
    pub calls_ok: u64,
    /// Calls that failed (no provider, refused, timeout, mismatch).
    pub calls_failed: u64,
    /// Median call latency over recent calls, ms.
    pub p50_ms: Option<f64>,
    /// 95th percentile call latency over recent calls, ms.
    pub p95_ms: Option<f64>,
    /// Last call error seen, for the curious.
    pub last_error: Option<String>,
}

impl std::fmt::Display for DemoStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        write!(
            f,
            "members ready {}/{} | calls ok {} failed {} | p50 {} ms p95 {} ms",
            self.ready,
            self.members,
            self.calls_ok,
            self.calls_failed,
            ms(self.p50_ms),
            ms(self.p95_ms)
        )
    }
}

#[derive(Default)]
struct Shared {
    ok: u64,
    failed: u64,
    latencies_ms: Vec<f64>,
    next: usize,
    last_error: Option<String>,
}

/// Running demo members.
pub struct Demo {
    nodes: Arc<Vec<node::NodeHandle>>,
    shared: Arc<Mutex<Shared>>,
    cancel: CancellationToken,
    tasks: JoinSet<()>,
}

/// Why the demo could not start.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The echo backend could not bind.
    #[error("echo backend: {0}")]
    Echo(std::io::Error),
    /// A member did not start.
    #[error("member {index}: {reason}")]
    Member {
        /// Which member.
        index: usize,
        /// Why.
        reason: String,
    },
}

impl Demo {
    /// Starts the echo backend and the members, then their call loops.
    pub async fn start(config: DemoConfig) -> Result<Self, DemoError> {
        let cancel = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let echo = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .map_err(DemoError::Echo)?;
        let echo_addr = echo.local_addr().map_err(DemoError::Echo)?;
        tasks.spawn(serve_echo(echo, cancel.clone()));

        let mut nodes = Vec::with_capacity(config.members);
        for index in 0..config.members {
            let nc = node::Config {
                control_plane: node::config::ControlPlaneConfig {
                    url: config.control_plane.clone(),
                    token: config.token.clone(),
                    ..Default::default()
                },
                data_dir: config.data_dir.join(format!("member-{index}")),
                routers: node::config::RoutersConfig {
                    count: config.routers,
                    ..Default::default()
                },
                services: node::config::ServicesConfig {
                    expose: vec![(service_name(index), echo_addr)],
                    ..Default::default()
                },
                local: node::config::LocalConfig {
                    no_socket: true,
                    ..Default::default()
                },
                ..node::Config::default()
            };
            let handle = node::spawn(nc, None).await.map_err(|e| DemoError::Member {
                index,
                reason: e.to_string(),
            })?;
            nodes.push(handle);
        }
        let nodes = Arc::new(nodes);
        let shared = Arc::new(Mutex::new(Shared::default()));
        for index in 0..nodes.len() {
            tasks.spawn(call_loop(
                index,
                nodes.clone(),
                shared.clone(),
                config.call_interval,
                cancel.clone(),
            ));
        }
        Ok(Self {
            nodes,
            shared,
            cancel,
            tasks,
        })
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> DemoStats {
        let ready = self.nodes.iter().filter(|n| n.is_ready()).count();
        let s = self.shared.lock();
        let mut sorted = s.latencies_ms.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        DemoStats {
            members: self.nodes.len(),
            ready,
            calls_ok: s.ok,
            calls_failed: s.failed,
            p50_ms: percentile(&sorted, 0.50),
            p95_ms: percentile(&sorted, 0.95),
            last_error: s.last_error.clone(),
        }
    }

    /// Stops the call loops and the members.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        while self.tasks.join_next().await.is_some() {}
        if let Ok(nodes) = Arc::try_unwrap(self.nodes) {
            for n in nodes {
                n.shutdown().await;
            }
        }
    }
}

/// The service name demo member `index` exposes.
pub fn service_name(index: usize) -> String {
    format!("echo-{index}")
}

fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let idx = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted.get(idx).copied()
}

async fn call_loop(
    index: usize,
    nodes: Arc<Vec<node::NodeHandle>>,
    shared: Arc<Mutex<Shared>>,
    interval: Duration,
    cancel: CancellationToken,
) {
    let me = &nodes[index];
    let mut status = me.status();
    // Wait to be ready before calling anyone.
    tokio::select! {
        _ = cancel.cancelled() => return,
        _ = status.wait_for(|s| s.ready) => {}
    }
    loop {
        let pause = jittered(interval);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        if nodes.len() < 2 {
            continue;
        }
        let target = {
            let mut rng = rand::thread_rng();
            let mut t = rng.gen_range(0..nodes.len() - 1);
            if t >= index {
                t += 1;
            }
            t
        };
        let started = tokio::time::Instant::now();
        let result =
            tokio::time::timeout(CALL_DEADLINE, echo_call(me, &service_name(target))).await;
        let mut s = shared.lock();
        match result {
            Ok(Ok(())) => {
                s.ok += 1;
                let ms = started.elapsed().as_secs_f64() * 1000.0;
                if s.latencies_ms.len() < LATENCY_SAMPLES {
                    s.latencies_ms.push(ms);
                } else {
                    let i = s.next % LATENCY_SAMPLES;
                    s.latencies_ms[i] = ms;
                }
                s.next += 1;
            }
            Ok(Err(e)) => {
                s.failed += 1;
                s.last_error = Some(e);
            }
            Err(_) => {
                s.failed += 1;
                s.last_error = Some(format!("call exceeded {CALL_DEADLINE:?}"));
            }
        }
    }
}

/// Sends a random payload through the mesh and checks it comes back intact.
async fn echo_call(node: &node::NodeHandle, service: &str) -> Result<(), String> {
    let mut stream = node.call(service).await.map_err(|e| e.to_string())?;
    let payload: Vec<u8> = (0..PAYLOAD_BYTES).map(|_| rand::random::<u8>()).collect();
    stream
        .write_all(&payload)
        .await
        .map_err(|e| format!("write: {e}"))?;
    stream.flush().await.map_err(|e| format!("flush: {e}"))?;
    let mut back = vec![0u8; PAYLOAD_BYTES];
    stream
        .read_exact(&mut back)
        .await
        .map_err(|e| format!("read: {e}"))?;
    if back != payload {
        return Err("echo mismatch".into());
    }
    let _ = stream.shutdown().await;
    Ok(())
}

fn jittered(base: Duration) -> Duration {
    let f: f64 = rand::thread_rng().gen_range(0.5..1.5);
    base.mul_f64(f)
}

async fn serve_echo(listener: TcpListener, cancel: CancellationToken) {
    let permits = Arc::new(tokio::sync::Semaphore::new(ECHO_MAX_CONNECTIONS));
    let mut backoff = agentmesh_runtime::accept::AcceptBackoff::new();
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        let mut sock = match accepted {
            Ok((sock, _)) => {
                backoff.succeeded();
                sock
            }
            Err(e) => {
                // E.g. out of file descriptors: pause (growing) rather than spin.
                let pause = backoff.failed();
                tracing::warn!(error = %e, ?pause, "demo echo backend: accept failed, pausing");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(pause) => continue,
                }
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            // Over the bound: refuse by closing.
            continue;
        };
        tokio::spawn(async move {
            let _permit = permit;
            let (mut r, mut w) = sock.split();
            let _ = tokio::time::timeout(Duration::from_secs(300), tokio::io::copy(&mut r, &mut w))
                .await;
        });
    }
}
