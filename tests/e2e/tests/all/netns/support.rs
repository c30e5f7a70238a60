//! A mesh of real binaries on testbed hosts (`agentmesh-netns`): the
//! control plane, each router and each member on a host of its own, members
//! on public hosts or behind NAT gateways. Every host has its own network
//! stack, so each program listens on fixed ports of its own address (no
//! port is shared with anything else on the machine). The test reaches
//! `/readyz` and `/metrics` from inside the hosts, and each member's
//! `STATUS` over its Unix socket (a file, the same in every namespace).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig};
use agentmesh_netns::{Host, Nat, NatKind, Proc, Testbed, testbed_or_skip};
use agentmesh_node::status::report::Report;
use agentmesh_proto::credential::map_to_labels;
use agentmesh_proto::pb::controlplane::{ApplyPolicyRequest, CreateTokenRequest};
use agentmesh_proto::pb::credential::{Role, TokenKind};
use libp2p::PeerId;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

/// Deadline of every wait for something that must happen (generous: the
/// machine may be loaded; nothing asserts how fast).
pub(crate) const DEADLINE: Duration = Duration::from_secs(90);
/// Deadline of one HTTP read or Unix-socket exchange.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Period of every poll.
pub(crate) const POLL: Duration = Duration::from_millis(200);
/// The control plane's admin bearer token.
const ADMIN: &str = "netns-admin-token-0123456789abcdef";

const CP_GRPC_PORT: u16 = 7400;
const CP_HTTP_PORT: u16 = 7401;
const ROUTER_PORT: u16 = 4001;
const ROUTER_METRICS_PORT: u16 = 9100;
/// A member's `/metrics` and `/readyz`, on its own loopback.
const MEMBER_METRICS: &str = "127.0.0.1:9464";
/// A member's echo backend, on its own loopback.
const ECHO: &str = "127.0.0.1:7000";
/// A member's first `--forward` port, on its own loopback.
const FIRST_FORWARD_PORT: u16 = 7100;

const CP_EXE: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-control-plane");
const ROUTER_EXE: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-router");
const NODE_EXE: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-node");

/// Polls `f` until it returns `Some`, up to [`DEADLINE`]; the panic names `what`.
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "{what}: not within {DEADLINE:?}");
        tokio::time::sleep(POLL).await;
    }
}

/// A program's `GET /readyz` from inside its host is 200.
async fn ready_at(host: &Host, addr: SocketAddr) -> bool {
    host.http_get(addr, "/readyz", READ_TIMEOUT)
        .await
        .is_ok_and(|r| r.status == 200)
}

/// Waits until `addr/readyz` answers 200 from inside `host`; fails early
/// (quoting its log) if `proc` exits.
async fn wait_ready(what: &str, host: &Host, addr: SocketAddr, proc: &mut Proc) {
    let end = Instant::now() + DEADLINE;
    while !ready_at(host, addr).await {
        if let Some(status) = proc.try_exited() {
            panic!("{what} exited ({status}):\n{}", proc.log_tail());
        }
        assert!(
            Instant::now() < end,
            "{what} not ready within {DEADLINE:?}:\n{}",
            proc.log_tail()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// A router binary on a host of its own.
pub(crate) struct RouterOnHost {
    /// `r1`, `r2`…
    pub(crate) name: String,
    /// Its host.
    pub(crate) host: Host,
    /// The running binary.
    pub(crate) proc: Proc,
    /// Its PeerId (from its log).
    pub(crate) peer_id: PeerId,
    /// Its `/metrics` and `/readyz` (on its host's address).
    pub(crate) metrics: SocketAddr,
}

impl RouterOnHost {
    /// Where members dial it.
    pub(crate) fn listen_addr(&self) -> SocketAddr {
        SocketAddr::new(self.host.addr().into(), ROUTER_PORT)
    }
}

/// A member binary on a host of its own.
pub(crate) struct Member {
    /// Its name (host and log).
    pub(crate) name: String,
    /// Its host.
    pub(crate) host: Host,
    /// The running binary.
    pub(crate) proc: Proc,
    /// Its data dir (the Unix socket is in it).
    pub(crate) dir: PathBuf,
    /// Its `--forward` listeners by service, on its host's loopback.
    pub(crate) forwards: BTreeMap<String, SocketAddr>,
}

/// What a member runs with.
#[derive(Debug, Clone, Default)]
pub(crate) struct MemberSpec {
    /// `--routers` (K).
    pub(crate) routers: usize,
    /// A service it exposes, backed by an echo server on its loopback.
    pub(crate) expose: Option<String>,
    /// Services it forwards a local port to.
    pub(crate) forwards: Vec<String>,
    /// `--router-selector name=…`.
    pub(crate) router: Option<String>,
    /// More `run` arguments (e.g. `--direct=true`).
    pub(crate) args: Vec<String>,
}

/// The mesh: the testbed, the control plane and the routers.
pub(crate) struct Net {
    /// The testbed (removes every namespace, and the programs in them, when dropped).
    pub(crate) tb: Testbed,
    dir: tempfile::TempDir,
    cp_host: Host,
    cp: Proc,
    /// The control plane's gRPC URL.
    pub(crate) cp_url: String,
    /// The routers, in start order.
    pub(crate) routers: Vec<RouterOnHost>,
    member_token: PathBuf,
}

impl Net {
    /// A testbed with the control plane on a public host (its arguments
    /// plus `cp_args`), or `None` when the test is skipped (see
    /// [`testbed_or_skip`]).
    pub(crate) async fn start(test: &str, cp_args: &[&str]) -> Option<Net> {
        let tb = testbed_or_skip(test).await?;
        let dir = tempfile::tempdir().expect("tempdir");
        let cp_host = tb.public_host("cp").await.expect("cp host");
        let ip = cp_host.addr();
        let admin = dir.path().join("admin.token");
        std::fs::write(&admin, ADMIN).expect("admin token");
        let grpc = SocketAddr::new(ip.into(), CP_GRPC_PORT);
        let http = SocketAddr::new(ip.into(), CP_HTTP_PORT);
        let mut cp = cp_host
            .program("control-plane", CP_EXE)
            .args([
                "--grpc-addr",
                &grpc.to_string(),
                "--http-addr",
                &http.to_string(),
            ])
            // Plaintext off loopback: the testbed's own private network.
            .arg("--insecure")
            .arg(format!(
                "--db=sqlite://{}",
                dir.path().join("cp.db").display()
            ))
            .arg(format!("--admin-token-file={}", admin.display()))
            // Members enforce the access policy (a fresh control plane
            // denies every call): these tests are about the network, so
            // every member may provide and call everything.
            .arg("--policy-allow-all")
            .args(cp_args)
            .env("NO_COLOR", "1")
            .spawn()
            .await
            .expect("start the control plane");
        wait_ready("control plane", &cp_host, http, &mut cp).await;
        let mut net = Net {
            tb,
            dir,
            cp_host,
            cp,
            cp_url: format!("http://{grpc}"),
            routers: Vec::new(),
            member_token: PathBuf::new(),
        };
        let token = net.token(Role::Member, &BTreeMap::new()).await;
        net.member_token = net.write("member.token", &token);
        Some(net)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, format!("{text}\n")).expect("write");
        p
    }

    /// A bootstrap token of `role` with `labels`, minted through the admin
    /// API from inside the control plane's host.
    pub(crate) async fn token(&self, role: Role, labels: &BTreeMap<String, String>) -> String {
        let labels = map_to_labels(labels);
        self.admin(move |client| async move {
            client
                .create_token(
                    ADMIN,
                    CreateTokenRequest {
                        kind: TokenKind::Bootstrap as i32,
                        role: role as i32,
                        labels,
                        max_uses: 100,
                        ttl_secs: 3600,
                    },
                )
                .await
                .expect("create token")
                .token
        })
        .await
    }

    /// A client of the control plane's admin API, on its host.
    async fn admin<T, F, Fut>(&self, f: F) -> T
    where
        F: FnOnce(Client) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let url = self.cp_url.clone();
        self.cp_host
            .spawn(async move {
                let client = Client::new(ClientConfig {
                    url,
                    ca_pem: None,
                    retry_budget: Duration::from_secs(30),
                    rpc_timeout: Duration::from_secs(10),
                })
                .expect("client");
                f(client).await
            })
            .await
            .expect("admin task")
    }

    /// Applies the access policy `text` through the admin API.
    pub(crate) async fn apply_policy(&self, text: &str) {
        let text = text.to_string();
        self.admin(|c| async move {
            c.apply_policy(
                ADMIN,
                ApplyPolicyRequest {
                    text,
                    dry_run: false,
                    author: "netns test".into(),
                },
            )
            .await
            .expect("policy applied");
        })
        .await;
    }

    /// Revokes the member `peer` through the admin API.
    pub(crate) async fn revoke_node(&self, peer: PeerId) {
        self.admin(move |c| async move {
            c.revoke_node(ADMIN, &peer, "netns test")
                .await
                .expect("revoked");
        })
        .await;
    }

    /// Starts router `name` (labelled `name=NAME`) on a public host of its
    /// own and waits until it is ready.
    pub(crate) async fn add_router(&mut self, name: &str) -> usize {
        self.add_router_with(name, &[]).await
    }

    /// [`Net::add_router`] with extra router arguments.
    pub(crate) async fn add_router_with(&mut self, name: &str, extra: &[&str]) -> usize {
        let host = self.tb.public_host(name).await.expect("router host");
        let labels: BTreeMap<String, String> = [("name".to_string(), name.to_string())].into();
        let token = self.token(Role::Router, &labels).await;
        let token_file = self.write(&format!("{name}.token"), &token);
        let metrics = SocketAddr::new(host.addr().into(), ROUTER_METRICS_PORT);
        let mut proc = host
            .program(name, ROUTER_EXE)
            .args(["--control-plane", &self.cp_url])
            .arg(format!("--token-file={}", token_file.display()))
            .arg(format!(
                "--key-path={}",
                self.dir.path().join(format!("{name}.key")).display()
            ))
            .args([
                "--listen",
                &format!("/ip4/{}/tcp/{ROUTER_PORT}", host.addr()),
            ])
            // QUIC on the same port number (UDP): members with
            // `--direct-transport=quic` attach over it.
            .args([
                "--listen",
                &format!("/ip4/{}/udp/{ROUTER_PORT}/quic-v1", host.addr()),
            ])
            .args(["--metrics-addr", &metrics.to_string()])
            .args(["--label", &format!("name={name}")])
            .args(["--lease-interval-secs", "1", "--clock-skew-secs", "0"])
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .spawn()
            .await
            .expect("start a router");
        let peer_id = proc
            .wait_for_log("router started", DEADLINE, |line| {
                let (_, rest) = line
                    .split_once("router started")?
                    .1
                    .split_once("peer_id=")?;
                rest.split_whitespace().next()?.parse::<PeerId>().ok()
            })
            .await
            .expect("the router's peer id");
        wait_ready(name, &host, metrics, &mut proc).await;
        self.routers.push(RouterOnHost {
            name: name.to_string(),
            host,
            proc,
            peer_id,
            metrics,
        });
        self.routers.len() - 1
    }

    /// A host for a member: public, or behind a fresh NAT of `nat`'s kind
    /// (the gateway is named `NAME-gw`).
    pub(crate) async fn member_host(
        &self,
        name: &str,
        nat: Option<NatKind>,
    ) -> (Host, Option<Nat>) {
        match nat {
            None => (self.tb.public_host(name).await.expect("host"), None),
            Some(kind) => {
                let gw = self.tb.nat(&format!("{name}-gw"), kind).await.expect("nat");
                let h = self.tb.host_behind(&gw, name).await.expect("host");
                (h, Some(gw))
            }
        }
    }

    /// Starts a member binary on `host` (not waiting for readiness).
    pub(crate) async fn member(&self, name: &str, host: Host, spec: &MemberSpec) -> Member {
        let dir = self.dir.path().join(name);
        let mut p = host
            .program(name, NODE_EXE)
            .args(["run", "--control-plane", &self.cp_url])
            .arg(format!("--token-file={}", self.member_token.display()))
            .arg(format!("--data-dir={}", dir.display()))
            .args(["--routers", &spec.routers.max(1).to_string()])
            .args(["--directory-interval-secs", "1"])
            // A router behind a dead link is noticed in about 2 × 2 + 5 +
            // 10 s (see the flag's help), not after the default 60 s.
            .args(["--ping-interval-secs", "2", "--ping-timeout-secs", "5"])
            .args(["--metrics-addr", MEMBER_METRICS])
            .env(
                "RUST_LOG",
                std::env::var("AGENTMESH_NETNS_MEMBER_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("NO_COLOR", "1");
        if let Some(r) = &spec.router {
            p = p.args(["--router-selector", &format!("name={r}")]);
        }
        p = p.args(&spec.args);
        if let Some(service) = &spec.expose {
            let l = host
                .bind_tcp(ECHO.parse().expect("addr"))
                .await
                .expect("echo backend");
            tokio::spawn(echo(l));
            p = p.args(["--expose", &format!("{service}={ECHO}")]);
        }
        let mut forwards = BTreeMap::new();
        for (i, service) in spec.forwards.iter().enumerate() {
            let port = FIRST_FORWARD_PORT + u16::try_from(i).expect("few forwards");
            let listen = SocketAddr::from(([127, 0, 0, 1], port));
            p = p.args(["--forward", &format!("{listen}={service}")]);
            forwards.insert(service.clone(), listen);
        }
        let proc = p.spawn().await.expect("start a member");
        Member {
            name: name.to_string(),
            host,
            proc,
            dir,
            forwards,
        }
    }

    /// Router `index`'s value of the metric series `series` (0 if absent).
    pub(crate) async fn router_metric(&self, index: usize, series: &str) -> f64 {
        let r = &self.routers[index];
        let m = r
            .host
            .http_get(r.metrics, "/metrics", READ_TIMEOUT)
            .await
            .expect("router metrics");
        agentmesh_testkit::metric(&m.body, series)
    }

    /// The routers' `agentmesh_router_circuit_requests_total{result="accepted"}`, summed.
    pub(crate) async fn circuits_accepted(&self) -> f64 {
        let mut sum = 0.0;
        for r in &self.routers {
            let m = r
                .host
                .http_get(r.metrics, "/metrics", READ_TIMEOUT)
                .await
                .expect("router metrics");
            sum += agentmesh_testkit::metric(
                &m.body,
                r#"agentmesh_router_circuit_requests_total{result="accepted"}"#,
            );
        }
        sum
    }
}

/// Echoes every connection until the caller half-closes.
async fn echo(l: tokio::net::TcpListener) {
    while let Ok((mut s, _)) = l.accept().await {
        tokio::spawn(async move {
            let (mut r, mut w) = s.split();
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.shutdown().await;
        });
    }
}

impl Member {
    /// Its `/readyz` answers 200 (read from inside its host).
    pub(crate) async fn is_ready(&self) -> bool {
        ready_at(&self.host, MEMBER_METRICS.parse().expect("addr")).await
    }

    /// Waits until it is ready.
    pub(crate) async fn wait_ready(&mut self) {
        let (host, name) = (self.host.clone(), self.name.clone());
        wait_ready(
            &name,
            &host,
            MEMBER_METRICS.parse().expect("addr"),
            &mut self.proc,
        )
        .await;
    }

    /// Its `/metrics`.
    pub(crate) async fn metrics(&self) -> String {
        self.host
            .http_get(
                MEMBER_METRICS.parse().expect("addr"),
                "/metrics",
                READ_TIMEOUT,
            )
            .await
            .expect("member metrics")
            .body
    }

    /// What it reports over its Unix socket (`STATUS`), if it answers.
    pub(crate) async fn status(&self) -> Option<Report> {
        let path = self.dir.join(agentmesh_node::config::SOCKET_FILE);
        let exchange = async {
            let mut u = tokio::net::UnixStream::connect(&path).await.ok()?;
            u.write_all(b"STATUS\n").await.ok()?;
            let mut line = String::new();
            tokio::io::BufReader::new(u)
                .read_line(&mut line)
                .await
                .ok()?;
            serde_json::from_str::<Report>(&line).ok()
        };
        tokio::time::timeout(READ_TIMEOUT, exchange)
            .await
            .ok()
            .flatten()
    }

    /// One `agentmesh-node ping SERVICE` attempt through its socket (a
    /// call set up and closed): the path and round trip it reports.
    pub(crate) async fn ping(&self, service: &str) -> Option<agentmesh_node::ping::PingReply> {
        let path = self.dir.join(agentmesh_node::config::SOCKET_FILE);
        let exchange = async {
            let mut u = tokio::net::UnixStream::connect(&path).await.ok()?;
            u.write_all(format!("PING {service}\n").as_bytes())
                .await
                .ok()?;
            let mut line = String::new();
            tokio::io::BufReader::new(u)
                .read_line(&mut line)
                .await
                .ok()?;
            serde_json::from_str(&line).ok()
        };
        tokio::time::timeout(DEADLINE, exchange)
            .await
            .ok()
            .flatten()
    }

    /// The value of its metric series `series` (0 if absent).
    pub(crate) async fn metric(&self, series: &str) -> f64 {
        agentmesh_testkit::metric(&self.metrics().await, series)
    }

    /// The routers it holds a reservation on.
    pub(crate) async fn reserved(&self) -> Vec<String> {
        self.status()
            .await
            .map(|s| {
                s.routers
                    .into_iter()
                    .filter(|r| r.state == "reserved")
                    .map(|r| r.peer_id)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// One call of `service` through its `--forward` listener: `payload`
    /// out, half-close, the answer read to its end.
    pub(crate) async fn call(&self, service: &str, payload: &[u8]) -> Result<Vec<u8>, String> {
        let addr = *self
            .forwards
            .get(service)
            .expect("a forward of that service");
        let mut s = self.host.connect(addr).await.map_err(|e| e.to_string())?;
        let (mut r, mut w) = s.split();
        let send = async {
            w.write_all(payload).await?;
            w.shutdown().await
        };
        let recv = async {
            let mut back = Vec::new();
            r.read_to_end(&mut back).await.map(|_| back)
        };
        let exchange = async { tokio::try_join!(send, recv) };
        match tokio::time::timeout(DEADLINE, exchange).await {
            Ok(Ok(((), back))) => Ok(back),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {DEADLINE:?}")),
        }
    }

    /// Calls `service` until the echo comes back whole (the routers' DHT
    /// needs a moment to learn a new record), up to [`DEADLINE`].
    pub(crate) async fn call_until_echoed(&self, service: &str, payload: &[u8]) {
        let end = Instant::now() + DEADLINE;
        loop {
            match self.call(service, payload).await {
                Ok(back) if back == payload => return,
                other => {
                    let why = match other {
                        Ok(back) => format!("{} of {} bytes back", back.len(), payload.len()),
                        Err(e) => e,
                    };
                    assert!(
                        Instant::now() < end,
                        "{} calling {service}: {why}\n{}",
                        self.name,
                        self.proc.log_tail()
                    );
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }
}

/// Every member of `members` ready.
pub(crate) async fn all_ready(members: &mut [Member]) {
    for m in members.iter_mut() {
        m.wait_ready().await;
    }
}

/// The port members with `--direct=true` listen on and dial from.
pub(crate) const LISTEN_PORT: u16 = 4500;

/// A member with direct connections on, on [`LISTEN_PORT`], attached to
/// two routers (two observations of its mapping), exposing `expose` and
/// forwarding to `forwards`.
pub(crate) fn direct_spec(expose: Option<&str>, forwards: &[&str]) -> MemberSpec {
    MemberSpec {
        routers: 2,
        expose: expose.map(str::to_string),
        forwards: forwards.iter().map(|s| s.to_string()).collect(),
        args: vec![
            "--direct=true".to_string(),
            format!("--listen-port={LISTEN_PORT}"),
        ],
        ..Default::default()
    }
}

/// [`direct_spec`] with direct connections over QUIC.
pub(crate) fn direct_quic_spec(expose: Option<&str>, forwards: &[&str]) -> MemberSpec {
    let mut spec = direct_spec(expose, forwards);
    spec.args.push("--direct-transport=quic".to_string());
    spec
}

/// A caller's flags that notice a dead direct path within seconds: bytes
/// unacknowledged for 2 s fail the connection (TCP_USER_TIMEOUT), a call
/// gives up after 4 s.
pub(crate) const DEAD_PATH_NOTICED_FAST: [&str; 2] =
    ["--call-timeout-secs=4", "--direct-tcp-user-timeout-secs=2"];

/// Two members behind their own EIM NATs on two routers, as most direct
/// tests start: the provider exposing `echo-prov`, the caller forwarding
/// to it (each [`direct_spec`] plus its extra arguments), both ready.
pub(crate) struct EimPair {
    pub(crate) provider: Member,
    pub(crate) caller: Member,
    /// The provider's NAT gateway.
    pub(crate) provider_nat: Nat,
    /// The caller's NAT gateway.
    pub(crate) caller_nat: Nat,
}

impl Net {
    /// Starts [`EimPair`]: two routers, two EIM hosts, their members.
    pub(crate) async fn eim_pair(
        &mut self,
        provider_args: &[&str],
        caller_args: &[&str],
    ) -> EimPair {
        self.add_router("r1").await;
        self.add_router("r2").await;
        let (ph, pgw) = self
            .member_host("prov", Some(NatKind::EndpointIndependent))
            .await;
        let (ch, cgw) = self
            .member_host("caller", Some(NatKind::EndpointIndependent))
            .await;
        let with = |mut spec: MemberSpec, args: &[&str]| {
            spec.args.extend(args.iter().map(|a| a.to_string()));
            spec
        };
        let mut provider = self
            .member(
                "prov",
                ph,
                &with(direct_spec(Some("echo-prov"), &[]), provider_args),
            )
            .await;
        let mut caller = self
            .member(
                "caller",
                ch,
                &with(direct_spec(None, &["echo-prov"]), caller_args),
            )
            .await;
        provider.wait_ready().await;
        caller.wait_ready().await;
        EimPair {
            provider,
            caller,
            provider_nat: pgw.expect("the provider's NAT"),
            caller_nat: cgw.expect("the caller's NAT"),
        }
    }
}

/// The NAT kind `m`'s status names, once two routers observed it.
/// Calls `service` through `caller` with `payload` until one call's
/// stream went on a direct connection (the caller's
/// `calls_by_path_total{path="direct"}` counts it), up to [`DEADLINE`];
/// returns how many calls that took.
pub(crate) async fn call_until_direct(caller: &Member, service: &str, payload: &[u8]) -> u32 {
    let direct = r#"agentmesh_node_calls_by_path_total{path="direct"}"#;
    let calls = std::cell::Cell::new(0u32);
    eventually("a call on the direct connection", || {
        calls.set(calls.get() + 1);
        async {
            caller.call_until_echoed(service, payload).await;
            (caller.metric(direct).await >= 1.0).then_some(())
        }
    })
    .await;
    calls.get()
}

pub(crate) async fn nat_kind(m: &Member) -> String {
    eventually(&format!("{}: two routers observed it", m.name), || async {
        let d = m.status().await?.direct?;
        (d.observed.len() == 2).then_some(d.nat)
    })
    .await
}
