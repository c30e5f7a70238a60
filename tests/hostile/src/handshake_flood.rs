//! A handshake flood: as many TCP connections per second as the machine
//! allows to a router's (or a member's) listener from one source address,
//! each of which starts the noise handshake and stalls, or stalls before
//! it. Before the handshake a listener cannot tell these connections from a
//! member's dialing from the same address: the defence under test is what
//! it sheds while they pile up.
//!
//! `workers` connections are open at once; whenever one ends (the listener
//! refused or shed it, or it was held for `hold`), its worker dials the
//! next at once. Connections are closed with a reset (`SO_LINGER` 0) so the
//! flood leaves no `TIME_WAIT` behind and never runs out of ports.
//!
//! The flood runs on an OS thread of its own (its own single-threaded
//! runtime), so a test's runtime, and the members it starts, do not wait
//! behind it: the kernel shares the CPU between them as it would between
//! an attacker and a member on one host. Bounded: at most `max_attempts`
//! connections and `duration` in all; [`FloodHandle`] reads its counts
//! while it runs, says whether it still runs, and stops it.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use libp2p::Multiaddr;
use libp2p::multiaddr::Protocol;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::counts::{Progress, inc};

/// Deadline of one TCP connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause of a worker after a connect that failed (no port, refused, timed
/// out), so a listener that is gone does not make the flood spin.
const CONNECT_FAIL_PAUSE: Duration = Duration::from_millis(20);

/// multistream-select's header and the proposal of noise, as a lazy
/// (V1Lazy) dialer sends them before its first noise message.
const NOISE_PROPOSAL: &[u8] = b"\x13/multistream/1.0.0\n\x07/noise\n";

/// How a connection of the flood stalls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Stall {
    /// Not a byte: the handshake never starts.
    Silent,
    /// The noise proposal and a first noise message (an ephemeral key),
    /// then nothing: the listener answers and waits for the third message.
    Noise,
}

/// One run of the flood.
#[derive(Debug, Clone)]
pub struct Flood {
    /// The listener: `ip:port`.
    pub target: SocketAddr,
    /// The local address every connection leaves from.
    pub source_ip: IpAddr,
    /// Connections open at once, each renewed as soon as it ends.
    pub workers: usize,
    /// How a connection stalls.
    pub stall: Stall,
    /// How long the flood keeps a connection the listener leaves open.
    pub hold: Duration,
    /// How long the flood runs at most.
    pub duration: Duration,
    /// Connections attempted at most, all workers together.
    pub max_attempts: u64,
}

crate::counts::counts! {
    /// What one run did.
    pub struct Report (live FloodCounts, attack "handshake-flood") {
        /// TCP connects attempted.
        attempts,
        /// Connects that succeeded.
        connected,
        /// Connects that failed (no port, refused, timed out).
        connect_failed,
        /// Connections the listener closed or reset before `hold` ran out
        /// (refused, shed, or timed out by it).
        closed_by_listener,
        /// Connections on which the listener wrote something before (its
        /// half of the handshake: only with `Stall::Noise`).
        answered,
        /// Connections held for the whole `hold` and closed by the flood.
        held_to_end,
        /// How long the flood ran, milliseconds.
        elapsed_ms,
    }
}

impl Report {
    /// Connects attempted per second over the run.
    pub fn attempts_per_sec(&self) -> f64 {
        if self.elapsed_ms == 0 {
            return 0.0;
        }
        self.attempts as f64 * 1000.0 / self.elapsed_ms as f64
    }
}

/// A flood running on its own thread.
#[derive(Debug)]
pub struct FloodHandle {
    progress: Arc<Progress<FloodCounts>>,
    running: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Report>>,
}

impl FloodHandle {
    /// The counts so far.
    pub fn report(&self) -> Report {
        self.progress.report()
    }

    /// Whether the flood still runs (its duration and attempts not spent,
    /// not stopped).
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::SeqCst)
    }

    /// Stops the flood and returns what it did.
    pub fn stop(mut self) -> Report {
        self.progress.stop();
        self.join()
    }

    fn join(&mut self) -> Report {
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(r)) => r,
            _ => self.progress.report(),
        }
    }
}

impl Drop for FloodHandle {
    fn drop(&mut self) {
        self.progress.stop();
        let _ = self.join();
    }
}

/// Starts `flood` on an OS thread of its own.
pub fn spawn(flood: Flood) -> io::Result<FloodHandle> {
    let progress = Arc::new(Progress::<FloodCounts>::default());
    let running = Arc::new(AtomicBool::new(true));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (p, r) = (progress.clone(), running.clone());
    let thread = std::thread::Builder::new()
        .name("handshake-flood".into())
        .spawn(move || {
            let report = rt.block_on(run(flood, p));
            r.store(false, Ordering::SeqCst);
            report
        })?;
    Ok(FloodHandle {
        progress,
        running,
        thread: Some(thread),
    })
}

/// Runs `flood` until its duration or attempts are spent or `progress` is
/// stopped; returns what it did.
pub async fn run(flood: Flood, progress: Arc<Progress<FloodCounts>>) -> Report {
    let started = Instant::now();
    let deadline = started + flood.duration;
    let flood = Arc::new(flood);
    let mut workers = JoinSet::new();
    for _ in 0..flood.workers.max(1) {
        let (f, p) = (flood.clone(), progress.clone());
        workers.spawn(async move {
            let mut stopped = p.stopped();
            tokio::select! {
                () = worker(&f, &p, deadline) => {}
                _ = stopped.wait_for(|s| *s) => {}
            }
        });
    }
    while workers.join_next().await.is_some() {}
    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    progress.counts.elapsed_ms.store(ms, Ordering::Relaxed);
    progress.report()
}

async fn worker(f: &Flood, p: &Progress<FloodCounts>, deadline: Instant) {
    while Instant::now() < deadline {
        if p.counts.attempts.fetch_add(1, Ordering::Relaxed) >= f.max_attempts {
            p.counts.attempts.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        match connect(f.target, f.source_ip).await {
            Ok(stream) => {
                inc(&p.counts.connected);
                hold(stream, f, p, deadline).await;
            }
            Err(_) => {
                inc(&p.counts.connect_failed);
                tokio::time::sleep(CONNECT_FAIL_PAUSE).await;
            }
        }
    }
}

async fn connect(to: SocketAddr, from: IpAddr) -> io::Result<tokio::net::TcpStream> {
    let socket = if to.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_zero_linger()?;
    socket.bind(SocketAddr::new(from, 0))?;
    tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(to))
        .await
        .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

/// Stalls on `stream` until the listener closes it, `hold` runs out or the
/// flood's deadline passes; counts which.
async fn hold(
    mut stream: tokio::net::TcpStream,
    f: &Flood,
    p: &Progress<FloodCounts>,
    deadline: Instant,
) {
    if f.stall == Stall::Noise {
        let mut first = NOISE_PROPOSAL.to_vec();
        // Noise's first message: a 2-byte length and an ephemeral X25519
        // key (any 32 bytes are one).
        first.extend_from_slice(&[0, 32]);
        first.extend(std::iter::repeat_with(rand::random::<u8>).take(32));
        if stream.write_all(&first).await.is_err() {
            inc(&p.counts.closed_by_listener);
            return;
        }
    }
    let until = deadline.min(Instant::now() + f.hold);
    let mut buf = [0u8; 512];
    let mut answered = false;
    loop {
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => answered = true,
            Ok(_) => {
                inc(&p.counts.closed_by_listener);
                break;
            }
            Err(_) => {
                inc(&p.counts.held_to_end);
                break;
            }
        }
    }
    if answered {
        inc(&p.counts.answered);
    }
}

/// `/ip4/A/tcp/P` (or `/ip6`), a trailing `/p2p/ID` allowed.
pub fn socket_addr_of(addr: &Multiaddr) -> Option<SocketAddr> {
    let mut iter = addr.iter();
    let ip: IpAddr = match iter.next()? {
        Protocol::Ip4(ip) => ip.into(),
        Protocol::Ip6(ip) => ip.into(),
        _ => return None,
    };
    let Protocol::Tcp(port) = iter.next()? else {
        return None;
    };
    Some(SocketAddr::new(ip, port))
}

/// `agentmesh-hostile handshake-flood`: the flood's command line.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The listener to flood: /ip4/A/tcp/P (a trailing /p2p/ID is ignored).
    #[arg(long)]
    pub target: Multiaddr,
    /// Local address every connection leaves from (any of 127.0.0.0/8 on loopback).
    #[arg(long)]
    pub source_ip: IpAddr,
    /// Connections open at once, each renewed as soon as it ends, connections.
    #[arg(long, default_value_t = 256)]
    pub workers: usize,
    /// How a connection stalls.
    #[arg(long, value_enum, default_value_t = Stall::Silent)]
    pub stall: Stall,
    /// How long a connection the listener leaves open is held, milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub hold_ms: u64,
    /// How long the flood runs, seconds.
    #[arg(long, default_value_t = 30)]
    pub duration_secs: u64,
    /// Connections attempted at most, connections.
    #[arg(long, default_value_t = 10_000_000)]
    pub max_attempts: u64,
}

impl Args {
    /// Runs the flood (on its own thread) and returns its report.
    pub async fn run(self) -> anyhow::Result<Report> {
        use anyhow::Context as _;
        let target = socket_addr_of(&self.target).context("the target must be /ip4|ip6/A/tcp/P")?;
        let flood = Flood {
            target,
            source_ip: self.source_ip,
            workers: self.workers,
            stall: self.stall,
            hold: Duration::from_millis(self.hold_ms),
            duration: Duration::from_secs(self.duration_secs),
            max_attempts: self.max_attempts,
        };
        let handle = spawn(flood)?;
        let report = tokio::task::spawn_blocking(move || {
            let mut handle = handle;
            handle.join()
        })
        .await?;
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_a_plain_tcp_address() {
        let a: Multiaddr =
            "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
                .parse()
                .expect("addr");
        assert_eq!(
            socket_addr_of(&a),
            Some("127.0.0.1:4001".parse().expect("sa"))
        );
        let q: Multiaddr = "/ip4/127.0.0.1/udp/4001/quic-v1".parse().expect("addr");
        assert_eq!(socket_addr_of(&q), None);
    }

    /// Against a listener that accepts and closes at once: every attempt is
    /// counted, every connection closed by the listener, within its bounds.
    #[tokio::test]
    async fn a_bounded_flood_against_a_listener_that_closes_everything() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let target = l.local_addr().expect("addr");
        let acceptor = tokio::spawn(async move {
            loop {
                let Ok((s, _)) = l.accept().await else { return };
                drop(s);
            }
        });
        let handle = spawn(Flood {
            target,
            source_ip: "127.0.0.71".parse().expect("ip"),
            workers: 4,
            stall: Stall::Noise,
            hold: Duration::from_secs(30),
            duration: Duration::from_secs(30),
            max_attempts: 200,
        })
        .expect("spawn");
        let r = tokio::task::spawn_blocking(move || {
            let mut h = handle;
            h.join()
        })
        .await
        .expect("join");
        acceptor.abort();
        assert_eq!(r.attempts, 200, "{r}");
        assert_eq!(r.connected + r.connect_failed, 200, "{r}");
        assert_eq!(r.closed_by_listener, r.connected, "{r}");
        assert_eq!(r.held_to_end, 0, "{r}");
    }
}
