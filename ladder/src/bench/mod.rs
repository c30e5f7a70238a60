//! `agentmesh-ladder bench`: the data path measured side by side in one run
//! on loopback (issue 19), each path with the same bench protocol
//! ([`proto`]) and the same client:
//!
//! - plain TCP to the backend;
//! - bare rust-libp2p, direct (TCP + noise + yamux, a raw stream): the floor;
//! - bare rust-libp2p through a relay v2 circuit, limits lifted (the
//!   reference of the targets);
//! - the same bare circuit with TCP ends, like for like with agentmesh's
//!   path: client → TCP → a bare forwarder (one raw stream per connection)
//!   → circuit on a second bare relay → a bare listener that splices each
//!   stream to a TCP connection to the backend; both splices the node's
//!   (8 KiB buffers each way, `TCP_NODELAY`);
//! - agentmesh: a node's `--forward` → relayed call → a node's `--expose`
//!   → the backend, through one router, and with caller and provider on
//!   different routers (transit);
//! - agentmesh direct (issue 36): the same with both nodes on
//!   `--direct=true --direct-allow-loopback-targets=true`, measured once
//!   calls go over the punched connection (each round waits for a call to
//!   go direct first, and a row whose bytes did not all go direct fails:
//!   [`direct`]); against its floor like for like, a bare direct libp2p
//!   connection with the same TCP ends (a bare forwarder and a bare
//!   splicing listener) and the member's own muxer and limits. Then the
//!   time from the first relayed call to the first direct one over
//!   `--time-to-direct-samples` fresh punches.
//!
//! Rounds are interleaved: round 1 measures every path once, then round
//! 2, and so on, so a path's rounds are spread over the run as its
//! floor's are.
//!
//! For each: one stream's throughput, one-byte round trips (p50/p99), N
//! concurrent streams' total throughput, and CPU seconds per GiB for each
//! process (from `/proc/PID/stat`; on the paths with TCP ends the caller is
//! the forwarder, the provider the splicing listener, and the bench client
//! and backend are counted apart). Every process is a child of its own:
//! the floors' peers, the backend and the client are `bench-peer`
//! processes ([`peer`]); the agentmesh processes are our real binaries.
//!
//! - `proto.rs`: the bytes on every path; `peer.rs`: the `bench-peer`
//!   roles; `child.rs`: driving one from here; `p2p.rs`: the bare libp2p
//!   swarm; `agentmesh.rs`: our programs; `direct.rs`: the direct path's
//!   checks and time to direct; `report.rs`: rows, table, targets;
//!   `report_direct.rs`: the direct targets; `row.rs`: what one path and
//!   round measured.

mod agentmesh;
mod child;
pub mod direct;
mod p2p;
pub mod peer;
pub mod proto;
pub mod report;
pub mod report_direct;
pub mod row;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use crate::binaries::Binaries;
use crate::procstat;
use child::Peer;
use peer::{Request, Response};
use report::{BenchReport, CpuPerGib, PeakRss, Row};

/// Default bytes of the single-stream run, MiB.
pub const DEFAULT_SINGLE_MIB: u64 = 256;
/// Default recorded one-byte round trips.
pub const DEFAULT_ROUND_TRIPS: u32 = 2_000;
/// Default concurrent streams.
pub const DEFAULT_STREAMS: u32 = 16;
/// Default bytes of the concurrent run, all streams together, MiB.
pub const DEFAULT_CONCURRENT_MIB: u64 = 256;
/// Default deadline of one measurement request, seconds.
pub const DEFAULT_REQUEST_DEADLINE_SECS: u64 = 600;
/// Default samples of the time from the first relayed call to the first direct one.
pub const DEFAULT_TIME_TO_DIRECT_SAMPLES: u32 = 20;
/// Unrecorded round trips before the recorded ones.
const WARMUP_ROUND_TRIPS: u32 = 20;
const MIB: u64 = 1024 * 1024;
const GIB: f64 = (1024 * 1024 * 1024) as f64;

/// The flags of `bench`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct BenchConfig {
    /// Bytes one stream sends one way, KiB (default 256 MiB).
    #[arg(long, default_value_t = DEFAULT_SINGLE_MIB * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub single_kib: u64,
    /// Recorded one-byte round trips on one stream, round trips.
    #[arg(long, default_value_t = DEFAULT_ROUND_TRIPS, value_parser = clap::value_parser!(u32).range(1..))]
    pub round_trips: u32,
    /// Streams at once in the concurrent run, streams.
    #[arg(long, default_value_t = DEFAULT_STREAMS, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub streams: u32,
    /// Bytes of the concurrent run, all streams together, KiB (default 256 MiB).
    #[arg(long, default_value_t = DEFAULT_CONCURRENT_MIB * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub concurrent_kib: u64,
    /// Times every path is measured, rounds (one set of processes).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Fresh punches timed from the first relayed call to the first direct one, samples (0: none).
    #[arg(long, default_value_t = DEFAULT_TIME_TO_DIRECT_SAMPLES)]
    pub time_to_direct_samples: u32,
    /// Deadline of one measurement (a run of bytes or of round trips), seconds.
    #[arg(long, default_value_t = DEFAULT_REQUEST_DEADLINE_SECS)]
    pub request_deadline_secs: u64,
    /// Extra argument for both routers (repeatable).
    #[arg(long = "router-arg", allow_hyphen_values = true)]
    pub router_args: Vec<String>,
    /// Extra argument for the five nodes' `run` (repeatable).
    #[arg(long = "node-arg", allow_hyphen_values = true)]
    pub node_args: Vec<String>,
    /// Write the JSON report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Directory for the processes' data and logs (default: a new temp dir).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

/// One path: its client and the pids whose CPU it charges.
struct Path {
    name: &'static str,
    client: Peer,
    caller: Vec<u32>,
    router: Vec<u32>,
    provider: Vec<u32>,
    /// Paths with TCP ends (agentmesh, and the floor with TCP ends): the
    /// bench client and backend processes.
    extra: Option<(u32, u32)>,
    /// The agentmesh direct path: its `--forward` and its caller's metrics.
    direct: Option<(std::net::SocketAddr, std::net::SocketAddr)>,
}

/// Runs the bench; children are stopped before it returns, error or not.
pub async fn run(cfg: BenchConfig, command: String) -> anyhow::Result<BenchReport> {
    let bins = Binaries::locate()?;
    let (dir, made) = match &cfg.work_dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            (d.clone(), false)
        }
        None => (tempfile_dir()?, true),
    };
    let result = run_in(&cfg, bins, &dir).await;
    // A temp dir of our own is removed after a good run; after a failure
    // its logs say why.
    match &result {
        Ok(_) if made => {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(_) => {}
        Err(_) => eprintln!("bench: logs kept in {}", dir.display()),
    }
    let (rows, time_to_direct) = result?;
    Ok(BenchReport {
        command,
        direct: report_direct::direct_targets(&rows),
        time_to_direct,
        rows,
    })
}

async fn run_in(
    cfg: &BenchConfig,
    bins: Binaries,
    dir: &std::path::Path,
) -> anyhow::Result<(Vec<Row>, Option<report_direct::TimeToDirect>)> {
    let starter = Starter {
        ladder: bins.ladder.clone(),
        dir: dir.to_path_buf(),
    };
    let floors = Floors::start(&starter).await?;
    let mut mesh = agentmesh::Mesh::start(
        bins,
        dir,
        floors.backend_addr,
        &cfg.router_args,
        &cfg.node_args,
    )
    .await?;
    let mut paths = floors.paths(&starter).await?;
    paths.extend(agentmesh_paths(&starter, &mesh, &floors.backend).await?);

    let mut rows = Vec::new();
    let mut result = Ok(());
    'rounds: for round in 1..=cfg.rounds {
        for p in &mut paths {
            match measure_path(cfg, p, round).await {
                Ok(r) => rows.push(r),
                Err(e) => {
                    result = Err(e.context(format!("round {round}, {}", p.name)));
                    break 'rounds;
                }
            }
        }
    }
    for p in paths {
        p.client.stop().await;
    }
    // After the rounds: the samples restart the direct caller.
    let time_to_direct = match (&result, cfg.time_to_direct_samples) {
        (Ok(()), n) if n > 0 => Some(direct::time_to_direct(&mut mesh, n).await),
        _ => None,
    };
    mesh.shutdown().await;
    floors.stop().await;
    result?;
    Ok((rows, time_to_direct))
}

/// [`measure`], and on the agentmesh direct path first calls until one
/// goes direct, then the check that every byte of the run did.
async fn measure_path(cfg: &BenchConfig, p: &mut Path, round: u32) -> anyhow::Result<Row> {
    let Some((forward, metrics)) = p.direct else {
        return measure(cfg, p, round).await;
    };
    let before = direct::until_direct(forward, metrics).await?;
    let mut row = measure(cfg, p, round).await?;
    let after = direct::PathCounts::read(metrics).await?;
    row.path_bytes = Some(direct::check_direct(
        before,
        after,
        row.single_bytes + row.concurrent_bytes,
    )?);
    Ok(row)
}

/// Starts `bench-peer` children of the ladder with their logs in the run's dir.
struct Starter {
    ladder: PathBuf,
    dir: PathBuf,
}

impl Starter {
    async fn start(&self, name: &str, args: Vec<String>) -> anyhow::Result<Peer> {
        Peer::start(&self.ladder, &self.dir, name, &args).await
    }

    /// A bench client of `target`.
    async fn client(&self, name: &str, target: String) -> anyhow::Result<Peer> {
        self.start(name, with(role("client"), "--target", &target))
            .await
    }
}

/// `--role r`.
fn role(r: &str) -> Vec<String> {
    vec!["--role".to_string(), r.to_string()]
}

/// `v` with `k val` appended.
fn with(mut v: Vec<String>, k: &str, val: &str) -> Vec<String> {
    v.extend([k.to_string(), val.to_string()]);
    v
}

/// A peer's pid as a list (empty once it is gone).
fn pid(p: &Peer) -> Vec<u32> {
    p.pid().into_iter().collect()
}

/// The backend and the bare libp2p floors' peers.
struct Floors {
    backend: Peer,
    backend_addr: std::net::SocketAddr,
    direct: Peer,
    relay: Peer,
    relayed: Peer,
    ends_relay: Peer,
    ends_listener: Peer,
    ends_forward: Peer,
    direct_listener: Peer,
    direct_forward: Peer,
}

impl Floors {
    async fn start(s: &Starter) -> anyhow::Result<Self> {
        let backend = s.start("backend", role("serve-tcp")).await?;
        let backend_addr = backend.addr.parse().context("backend address")?;
        let direct = s.start("p2p-listener", role("serve-p2p")).await?;
        let relay = s.start("p2p-relay", role("relay")).await?;
        let relayed = s
            .start(
                "p2p-relayed-listener",
                with(role("serve-p2p"), "--relay", &relay.addr),
            )
            .await?;
        // The floor with TCP ends has a relay of its own: each relay's CPU is
        // its own path's.
        let ends_relay = s.start("p2p-relay-tcp-ends", role("relay")).await?;
        let ends_listener = s
            .start(
                "p2p-splice-listener",
                with(
                    with(role("serve-p2p"), "--relay", &ends_relay.addr),
                    "--splice-to",
                    &backend.addr,
                ),
            )
            .await?;
        let ends_forward = s
            .start(
                "p2p-forward",
                with(role("forward"), "--target", &ends_listener.addr),
            )
            .await?;
        // The direct floor with TCP ends, muxed as a member muxes.
        let member_yamux = |v| with(v, "--member-yamux", "true");
        let direct_listener = s
            .start(
                "p2p-direct-splice-listener",
                member_yamux(with(role("serve-p2p"), "--splice-to", &backend.addr)),
            )
            .await?;
        let direct_forward = s
            .start(
                "p2p-direct-forward",
                member_yamux(with(role("forward"), "--target", &direct_listener.addr)),
            )
            .await?;
        Ok(Self {
            backend,
            backend_addr,
            direct,
            relay,
            relayed,
            ends_relay,
            ends_listener,
            ends_forward,
            direct_listener,
            direct_forward,
        })
    }

    /// The plain-TCP path and the three bare libp2p floors, each with a client.
    async fn paths(&self, s: &Starter) -> anyhow::Result<Vec<Path>> {
        let mut paths = Vec::new();
        let c = s
            .client("client-tcp", format!("tcp:{}", self.backend.addr))
            .await?;
        paths.push(Path {
            name: "plain TCP to the backend",
            caller: pid(&c),
            client: c,
            router: Vec::new(),
            provider: pid(&self.backend),
            extra: None,
            direct: None,
        });
        let c = s.client("client-direct", self.direct.addr.clone()).await?;
        paths.push(Path {
            name: "bare libp2p, direct",
            caller: pid(&c),
            client: c,
            router: Vec::new(),
            provider: pid(&self.direct),
            extra: None,
            direct: None,
        });
        let c = s.client("client-relay", self.relayed.addr.clone()).await?;
        paths.push(Path {
            name: report::BARE_RELAY,
            caller: pid(&c),
            client: c,
            router: pid(&self.relay),
            provider: pid(&self.relayed),
            extra: None,
            direct: None,
        });
        let c = s
            .client(
                "client-relay-tcp-ends",
                format!("tcp:{}", self.ends_forward.addr),
            )
            .await?;
        let extra = c.pid().zip(self.backend.pid());
        paths.push(Path {
            name: report::BARE_RELAY_TCP_ENDS,
            client: c,
            caller: pid(&self.ends_forward),
            router: pid(&self.ends_relay),
            provider: pid(&self.ends_listener),
            extra,
            direct: None,
        });
        let c = s
            .client(
                "client-direct-tcp-ends",
                format!("tcp:{}", self.direct_forward.addr),
            )
            .await?;
        let extra = c.pid().zip(self.backend.pid());
        paths.push(Path {
            name: report_direct::BARE_DIRECT_TCP_ENDS,
            client: c,
            caller: pid(&self.direct_forward),
            router: Vec::new(),
            provider: pid(&self.direct_listener),
            extra,
            direct: None,
        });
        Ok(paths)
    }

    async fn stop(self) {
        for p in [
            self.direct_forward,
            self.direct_listener,
            self.ends_forward,
            self.ends_listener,
            self.ends_relay,
            self.relayed,
            self.relay,
            self.direct,
            self.backend,
        ] {
            p.stop().await;
        }
    }
}

/// The three agentmesh paths (same router, transit, direct), each with a client.
async fn agentmesh_paths(
    s: &Starter,
    mesh: &agentmesh::Mesh,
    backend: &Peer,
) -> anyhow::Result<Vec<Path>> {
    let mut paths = Vec::new();
    for (name, log, forward, pids) in [
        (
            "agentmesh, same router",
            "client-agentmesh-same",
            mesh.forward_same,
            mesh.same_pids(),
        ),
        (
            "agentmesh, transit (caller and provider on different routers)",
            "client-agentmesh-transit",
            mesh.forward_transit,
            mesh.transit_pids(),
        ),
    ] {
        let c = s.client(log, format!("tcp:{forward}")).await?;
        let extra = c.pid().zip(backend.pid());
        paths.push(Path {
            name,
            client: c,
            caller: pids.caller.into_iter().collect(),
            router: pids.routers,
            provider: pids.provider.into_iter().collect(),
            extra,
            direct: None,
        });
    }
    let c = s
        .client(
            "client-agentmesh-direct",
            format!("tcp:{}", mesh.forward_direct),
        )
        .await?;
    let pids = mesh.direct_pids();
    let extra = c.pid().zip(backend.pid());
    paths.push(Path {
        name: report_direct::AGENTMESH_DIRECT,
        client: c,
        caller: pids.caller.into_iter().collect(),
        router: pids.routers,
        provider: pids.provider.into_iter().collect(),
        extra,
        direct: Some((mesh.forward_direct, mesh.direct_caller_metrics())),
    });
    Ok(paths)
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("agentmesh-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    Ok(d)
}

/// CPU seconds of `pids` together (a process that is gone counts 0).
fn cpu(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|p| procstat::cpu_secs(*p)).sum()
}

/// Every process's CPU, in the order caller, router, provider, client, backend.
fn sample(p: &Path) -> [f64; 5] {
    let (c, b) = p.extra.unzip();
    [
        cpu(&p.caller),
        cpu(&p.router),
        cpu(&p.provider),
        cpu(&c.into_iter().collect::<Vec<_>>()),
        cpu(&b.into_iter().collect::<Vec<_>>()),
    ]
}

async fn secs(p: &mut Path, req: Request, deadline: Duration) -> anyhow::Result<f64> {
    match p.client.request(&req, deadline).await? {
        Response::Secs(s) if s > 0.0 => Ok(s),
        other => anyhow::bail!("unexpected answer {other:?}"),
    }
}

async fn measure(cfg: &BenchConfig, p: &mut Path, round: u32) -> anyhow::Result<Row> {
    let deadline = Duration::from_secs(cfg.request_deadline_secs);
    let single_bytes = cfg.single_kib * 1024;
    let streams = cfg.streams;
    let bytes_each = (cfg.concurrent_kib * 1024).div_ceil(u64::from(streams));
    let concurrent_bytes = bytes_each * u64::from(streams);

    let before = sample(p);
    let single = secs(
        p,
        Request::Sink {
            bytes: single_bytes,
        },
        deadline,
    )
    .await?;
    let mid = sample(p);
    let rtts = match p
        .client
        .request(
            &Request::Echo {
                warmup: WARMUP_ROUND_TRIPS,
                count: cfg.round_trips,
            },
            deadline,
        )
        .await?
    {
        Response::RttsMicros(v) => v,
        other => anyhow::bail!("unexpected answer {other:?}"),
    };
    let mid2 = sample(p);
    let concurrent = secs(
        p,
        Request::Concurrent {
            bytes_each,
            streams,
        },
        deadline,
    )
    .await?;
    let after = sample(p);
    // The round trips move almost no bytes: their CPU is left out.
    let gib = (single_bytes + concurrent_bytes) as f64 / GIB;
    let per_gib = |i: usize| ((mid[i] - before[i]) + (after[i] - mid2[i])) / gib;
    let has = |v: &[u32]| !v.is_empty();
    let cpu = CpuPerGib {
        caller: has(&p.caller).then(|| per_gib(0)),
        router: has(&p.router).then(|| per_gib(1)),
        provider: has(&p.provider).then(|| per_gib(2)),
        client: p.extra.map(|_| per_gib(3)),
        backend: p.extra.map(|_| per_gib(4)),
    };
    let peak = |v: &[u32]| {
        v.iter()
            .filter_map(|p| procstat::peak_rss_bytes(*p))
            .max()
            .map(|b| b as f64 / MIB as f64)
    };
    let peak_rss_mib = PeakRss {
        caller: peak(&p.caller),
        provider: peak(&p.provider),
    };
    let ms: Vec<f64> = rtts.iter().map(|us| us / 1000.0).collect();
    Ok(Row {
        path: p.name.to_string(),
        round,
        single_bytes,
        single_mib_per_sec: single_bytes as f64 / MIB as f64 / single,
        round_trips: ms.len(),
        rtt_p50_ms: report::quantile(&ms, 0.5),
        rtt_p99_ms: report::quantile(&ms, 0.99),
        streams,
        concurrent_bytes,
        concurrent_mib_per_sec: concurrent_bytes as f64 / MIB as f64 / concurrent,
        cpu_secs_per_gib: cpu,
        peak_rss_mib,
        path_bytes: None,
    })
}

/// `agentmesh-ladder bench`: runs, prints the table, writes the JSON report.
pub async fn main(cfg: BenchConfig) -> anyhow::Result<()> {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let path = cfg.report.clone();
    let report = run(cfg, command).await?;
    println!("{}", report.markdown());
    if let Some(path) = path {
        let json = serde_json::to_string_pretty(&report).context("encoding the report")?;
        std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench: report written to {}", path.display());
    }
    Ok(())
}
