//! The agentmesh paths of the bench, all real programs: a control plane
//! (the ladder's [`LocalMesh`], no routers of its own), two routers
//! labelled `bench-r0=1` and `bench-r1=1` so members can be pinned, a
//! caller node (`--forward` for both services, on r0), a provider on r0
//! (`bench-same`: the call is relayed by the router both members hold)
//! and a provider on r1 (`bench-transit`: the caller reaches r1 over a
//! transit connection and is relayed there). Both providers `--expose`
//! the bench's backend. A second pair on r0 runs with `--direct=true` and
//! `--direct-allow-loopback-targets=true` (`bench-direct`): its calls go
//! relayed first, then over the connection their punch opened
//! ([`super::direct`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig};
use agentmesh_proto::pb::controlplane::CreateTokenRequest;
use agentmesh_proto::pb::credential::{Label, Role, TokenKind};
use anyhow::{Context as _, bail};
use tokio::process::Child;
use tokio::time::Instant;

use crate::binaries::{self, Binaries};
use crate::children;
use crate::config::LocalConfig;
use crate::mesh::LocalMesh;
use crate::ports;

/// The node binary's name.
const NODE: &str = "agentmesh-node";
/// The services the providers expose.
pub(super) const SAME: &str = "bench-same";
/// The service of the provider on the other router.
pub(super) const TRANSIT: &str = "bench-transit";
/// The service of the provider of the direct pair.
pub(super) const DIRECT: &str = "bench-direct";
/// What the direct pair runs with beyond the others: direct connections,
/// and punches to loopback (every member of the bench is on one host).
const DIRECT_ARGS: [&str; 2] = ["--direct=true", "--direct-allow-loopback-targets=true"];
/// Members that enroll: caller, two providers, the direct pair (a
/// restarted member reuses its credential).
const MEMBERS: u64 = 5;
/// Time budget for the first call through each forward (publishing and
/// lookups settle), with a pause between attempts.
const FIRST_CALL_BUDGET: Duration = Duration::from_secs(90);
const FIRST_CALL_PAUSE: Duration = Duration::from_millis(500);
/// Deadline of one probe call.
const PROBE_DEADLINE: Duration = Duration::from_secs(15);
/// Grace for a child to exit after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A child program and its metrics address.
struct Proc {
    child: Child,
    metrics: SocketAddr,
}

impl Proc {
    fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// The running agentmesh side of the bench.
pub(super) struct Mesh {
    mesh: LocalMesh,
    routers: Vec<Proc>,
    caller: Proc,
    same: Proc,
    transit: Proc,
    /// The caller's `--forward` to [`SAME`].
    pub(super) forward_same: SocketAddr,
    /// The caller's `--forward` to [`TRANSIT`].
    pub(super) forward_transit: SocketAddr,
    /// The direct pair's caller (restarted for each time-to-direct sample).
    direct_caller: Proc,
    direct_provider: Proc,
    /// The direct caller's `--forward` to [`DIRECT`] (new at each restart).
    pub(super) forward_direct: SocketAddr,
    /// What starting a node again needs.
    node_bin: PathBuf,
    node_args: Vec<String>,
    dir: PathBuf,
}

/// The pids of one agentmesh path: caller node, the routers, provider node.
#[derive(Debug, Clone, Default)]
pub(super) struct Pids {
    /// The forwarding node.
    pub(super) caller: Option<u32>,
    /// Every router (the bench sums their CPU: only one relays a call).
    pub(super) routers: Vec<u32>,
    /// The exposing node.
    pub(super) provider: Option<u32>,
}

impl Mesh {
    /// Starts everything and waits until a call through each forward works.
    pub(super) async fn start(
        bins: Binaries,
        dir: &Path,
        backend: SocketAddr,
        router_args: &[String],
        node_args: &[String],
    ) -> anyhow::Result<Self> {
        let node_bin = binaries::find(
            bins.control_plane.parent().context("programs dir")?,
            NODE,
            "agentmesh-node",
        )?;
        let router_bin = bins.router.clone();
        let cfg = LocalConfig {
            routers: 0,
            ..LocalConfig::default()
        };
        let mesh = LocalMesh::start(bins, cfg, dir, MEMBERS).await?;
        let routers = start_routers(&mesh, &router_bin, dir, router_args).await?;
        let forward_same = ports::free_addr()?;
        let forward_transit = ports::free_addr()?;
        let nodes = Nodes {
            bin: &node_bin,
            mesh: &mesh,
            dir,
            node_args,
        };
        let same = nodes
            .start("bench-same", 0, vec![format!("--expose={SAME}={backend}")])
            .await?;
        let transit = nodes
            .start(
                "bench-transit",
                1,
                vec![format!("--expose={TRANSIT}={backend}")],
            )
            .await?;
        let caller = nodes
            .start(
                "bench-caller",
                0,
                vec![
                    format!("--forward={forward_same}={SAME}"),
                    format!("--forward={forward_transit}={TRANSIT}"),
                ],
            )
            .await?;
        let direct_provider = nodes
            .start(
                "bench-direct-provider",
                0,
                direct_args(vec![format!("--expose={DIRECT}={backend}")]),
            )
            .await?;
        let forward_direct = ports::free_addr()?;
        let direct_caller = nodes.start_direct_caller(forward_direct).await?;
        for addr in [forward_same, forward_transit, forward_direct] {
            first_call(addr).await?;
        }
        Ok(Self {
            mesh,
            routers,
            caller,
            same,
            transit,
            forward_same,
            forward_transit,
            direct_caller,
            direct_provider,
            forward_direct,
            node_bin,
            node_args: node_args.to_vec(),
            dir: dir.to_path_buf(),
        })
    }

    /// The pids of the direct path.
    pub(super) fn direct_pids(&self) -> Pids {
        Pids {
            caller: self.direct_caller.pid(),
            routers: self.routers.iter().filter_map(Proc::pid).collect(),
            provider: self.direct_provider.pid(),
        }
    }

    /// The direct caller's metrics address.
    pub(super) fn direct_caller_metrics(&self) -> SocketAddr {
        self.direct_caller.metrics
    }

    /// Stops the direct pair's caller and starts it again (same key and
    /// credential, a new listening port and `--forward` port), waiting
    /// until it is ready: a member with no connection to the provider,
    /// whose next call opens a new circuit and a new punch.
    pub(super) async fn restart_direct_caller(&mut self) -> anyhow::Result<()> {
        children::stop(&mut self.direct_caller.child, STOP_GRACE).await;
        let nodes = Nodes {
            bin: &self.node_bin,
            mesh: &self.mesh,
            dir: &self.dir,
            node_args: &self.node_args,
        };
        let forward = ports::free_addr()?;
        self.direct_caller = nodes.start_direct_caller(forward).await?;
        self.forward_direct = forward;
        Ok(())
    }

    /// The pids of the same-router path.
    pub(super) fn same_pids(&self) -> Pids {
        self.pids(&self.same)
    }

    /// The pids of the transit path.
    pub(super) fn transit_pids(&self) -> Pids {
        self.pids(&self.transit)
    }

    fn pids(&self, provider: &Proc) -> Pids {
        Pids {
            caller: self.caller.pid(),
            routers: self.routers.iter().filter_map(Proc::pid).collect(),
            provider: provider.pid(),
        }
    }

    /// Stops the nodes, the routers and the control plane.
    pub(super) async fn shutdown(mut self) {
        for p in [
            &mut self.caller,
            &mut self.same,
            &mut self.transit,
            &mut self.direct_caller,
            &mut self.direct_provider,
        ]
        .into_iter()
        .chain(self.routers.iter_mut())
        {
            children::stop(&mut p.child, STOP_GRACE).await;
        }
        self.mesh.shutdown().await;
    }
}

/// Mints a token for two routers labelled `bench-r0=1` and `bench-r1=1`
/// and starts them.
async fn start_routers(
    mesh: &LocalMesh,
    router_bin: &Path,
    dir: &Path,
    router_args: &[String],
) -> anyhow::Result<Vec<Proc>> {
    let client = Client::new(ClientConfig {
        url: mesh.url(),
        retry_budget: Duration::from_secs(60),
        ..ClientConfig::default()
    })?;
    let labels = ["bench-r0", "bench-r1"].map(|k| Label {
        key: k.to_string(),
        value: "1".to_string(),
    });
    let token = client
        .create_token(
            &mesh.admin_token,
            CreateTokenRequest {
                kind: TokenKind::Bootstrap as i32,
                role: Role::Router as i32,
                labels: labels.to_vec(),
                max_uses: 2,
                ttl_secs: 24 * 3600,
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("CreateToken (routers): {e}"))?
        .token;
    let token_file = children::write_secret(&dir.join("bench-router.token"), &token)?;
    let mut routers = Vec::new();
    for i in 0..2 {
        let metrics = ports::free_addr()?;
        let port = ports::free_port()?;
        let mut args: Vec<String> = [
            "--control-plane",
            &mesh.url(),
            "--token-file",
            &token_file.display().to_string(),
            "--key-path",
            &dir.join(format!("bench-r{i}.key")).display().to_string(),
            "--listen",
            &format!("/ip4/127.0.0.1/tcp/{port}"),
            "--metrics-addr",
            &metrics.to_string(),
            "--label",
            &format!("bench-r{i}=1"),
        ]
        .map(String::from)
        .to_vec();
        args.extend(router_args.iter().cloned());
        routers.push(start(router_bin, &args, dir, &format!("bench-r{i}"), metrics).await?);
    }
    Ok(routers)
}

/// What every bench node shares: the binary, the mesh, the run's dir and
/// the operator's `--node-arg`s.
struct Nodes<'a> {
    bin: &'a Path,
    mesh: &'a LocalMesh,
    dir: &'a Path,
    node_args: &'a [String],
}

/// `extra` and [`DIRECT_ARGS`].
fn direct_args(mut extra: Vec<String>) -> Vec<String> {
    extra.extend(DIRECT_ARGS.map(String::from));
    extra
}

impl Nodes<'_> {
    /// The direct pair's caller, forwarding `forward` to [`DIRECT`].
    async fn start_direct_caller(&self, forward: SocketAddr) -> anyhow::Result<Proc> {
        self.start(
            "bench-direct-caller",
            0,
            direct_args(vec![format!("--forward={forward}={DIRECT}")]),
        )
        .await
    }

    /// Starts node `name` pinned to router `bench-r{router}` with `extra`
    /// arguments (its `--expose` or `--forward`s) and waits until it is ready.
    async fn start(&self, name: &str, router: usize, extra: Vec<String>) -> anyhow::Result<Proc> {
        let data = self.dir.join(name);
        let mut args: Vec<String> = [
            "run",
            "--control-plane",
            &self.mesh.url(),
            "--token-file",
            &self.mesh.member_token_file.display().to_string(),
            "--data-dir",
            &data.display().to_string(),
            "--no-socket",
            "--routers",
            "1",
            "--router-selector",
            &format!("bench-r{router}=1"),
        ]
        .map(String::from)
        .to_vec();
        args.extend(extra);
        args.extend(self.node_args.iter().cloned());
        std::fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
        let metrics = ports::free_addr()?;
        args.extend(["--metrics-addr".to_string(), metrics.to_string()]);
        start(self.bin, &args, self.dir, name, metrics).await
    }
}

/// Spawns a program with its log in `dir/name.log` and waits for `/readyz`.
async fn start(
    bin: &Path,
    args: &[String],
    dir: &Path,
    name: &str,
    metrics: SocketAddr,
) -> anyhow::Result<Proc> {
    let log: PathBuf = dir.join(format!("{name}.log"));
    let mut child = children::spawn(bin, args, &log)?;
    children::wait_ready(name, &mut child, metrics, Duration::from_secs(60), &log).await?;
    Ok(Proc { child, metrics })
}

/// Calls through a forward until one small sink succeeds, within
/// [`FIRST_CALL_BUDGET`]: the provider's record reaches the caller a
/// little after both are ready.
pub(super) async fn first_call(addr: SocketAddr) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < FIRST_CALL_BUDGET {
        match probe(addr).await {
            Ok(()) => return Ok(()),
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(FIRST_CALL_PAUSE).await;
    }
    bail!("no call through the forward at {addr} succeeded within {FIRST_CALL_BUDGET:?}: {last}")
}

/// One call through the forward at `addr`: a sink of 1 KiB on a new
/// connection, within [`PROBE_DEADLINE`].
pub(super) async fn probe(addr: SocketAddr) -> anyhow::Result<()> {
    let call = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        super::proto::hello(&mut s, super::proto::MODE_SINK).await?;
        super::proto::sink(s, 1024).await
    };
    match tokio::time::timeout(PROBE_DEADLINE, call).await {
        Ok(r) => Ok(r.map(|_| ())?),
        Err(_) => bail!("no answer within {PROBE_DEADLINE:?}"),
    }
}
