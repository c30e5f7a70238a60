//! A set of real `agentmesh-control-plane` processes on one PostgreSQL
//! database, as an operator runs replicas: the same `--public-url` (a
//! logical name that resolves nowhere, so clients reach them only through
//! their endpoints, as they would through a headless Service), the same
//! key-encryption key and admin token, each on a loopback address of its
//! own that it keeps across restarts. A replica can be SIGKILLed and
//! started again on its address; every wait is bounded; the processes are
//! killed when the set is dropped, and their logs are printed then if the
//! test is failing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use agentmesh_controlplane::client::{Client, ClientConfig, Connections};
use agentmesh_controlplane::store::{KEK_ENV, Kek, testing};
use agentmesh_proto::credential::map_to_labels;
use agentmesh_proto::pb::controlplane::CreateTokenRequest;
use agentmesh_proto::pb::credential::{Role, TokenKind};
use agentmesh_testkit::{ADMIN, DEADLINE, free_tcp_port, metric, try_http_get};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-control-plane");

/// The URL every replica serves as its `--public-url` (proofs are bound to
/// it); `.invalid` never resolves, so only endpoints are dialled.
pub(super) const LOGICAL_URL: &str = "http://agentmesh-control-plane.invalid:7400";

/// One replica: its fixed addresses and, while it runs, its process.
pub(super) struct Replica {
    pub(super) grpc: SocketAddr,
    pub(super) http: SocketAddr,
    child: Option<Child>,
    log: PathBuf,
}

impl Replica {
    /// Its endpoint, as `--control-plane-endpoint` names it.
    pub(super) fn endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }
}

/// The replicas and what they share.
pub(super) struct Replicas {
    db: String,
    /// The key-encryption key and anything else every replica is given.
    env: Vec<(String, String)>,
    args: Vec<String>,
    admin_file: PathBuf,
    pub(super) all: Vec<Replica>,
    dir: tempfile::TempDir,
}

impl Replicas {
    /// Starts `n` replicas on a fresh database of the test server with
    /// `args` added to each, and waits until each is ready and counts `n`
    /// live replicas. `None` where there is no PostgreSQL server and it is
    /// not required (CI fails instead, see `store::testing`).
    pub(super) async fn start(n: usize, args: &[&str]) -> Option<Self> {
        let db = testing::fresh_database().await?;
        Some(Self::start_on(db.url, Vec::new(), n, args).await)
    }

    /// As [`Replicas::start`] on the database at `db`, each replica given
    /// `env` (a fresh key-encryption key is added).
    pub(super) async fn start_on(
        db: String,
        mut env: Vec<(String, String)>,
        n: usize,
        args: &[&str],
    ) -> Self {
        env.push((KEK_ENV.to_string(), Kek::generate_hex()));
        let dir = tempfile::tempdir().expect("tempdir");
        let admin_file = dir.path().join("admin-token");
        std::fs::write(&admin_file, ADMIN).expect("admin token file");
        let mut set = Self {
            db,
            env,
            args: args.iter().map(|a| a.to_string()).collect(),
            admin_file,
            all: Vec::new(),
            dir,
        };
        for i in 0..n {
            let replica = Replica {
                grpc: SocketAddr::from(([127, 0, 0, 1], free_tcp_port())),
                http: SocketAddr::from(([127, 0, 0, 1], free_tcp_port())),
                child: None,
                log: set.dir.path().join(format!("replica-{i}.log")),
            };
            set.all.push(replica);
            set.spawn(i);
        }
        for i in 0..n {
            set.until_ready(i).await;
        }
        set.until_live(n).await;
        set
    }

    /// Starts replica `i`'s process on its addresses (its log appended).
    fn spawn(&mut self, i: usize) {
        let r = &mut self.all[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&r.log)
            .expect("replica log");
        let child = Command::new(BIN)
            .args(["--db", &self.db, "--public-url", LOGICAL_URL])
            .args(["--grpc-addr", &r.grpc.to_string()])
            .args(["--http-addr", &r.http.to_string()])
            .arg("--admin-token-file")
            .arg(&self.admin_file)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("run the control plane");
        r.child = Some(child);
    }

    /// Every replica's endpoint, in order.
    pub(super) fn endpoints(&self) -> Vec<String> {
        self.all.iter().map(Replica::endpoint).collect()
    }

    /// A client of the logical URL dialling `endpoints` (retries within
    /// 30 s, 5 s per attempt, a connection per call as members use).
    pub(super) fn client_of(&self, endpoints: &[String]) -> Client {
        Client::with_endpoints(
            ClientConfig {
                url: LOGICAL_URL.to_string(),
                ca_pem: None,
                retry_budget: Duration::from_secs(30),
                rpc_timeout: Duration::from_secs(5),
            },
            Connections::PerCall,
            endpoints,
        )
        .expect("client")
    }

    /// A client of every replica.
    pub(super) fn client(&self) -> Client {
        self.client_of(&self.endpoints())
    }

    /// A bootstrap token of `role` (labels `labels`, `uses` uses, 1 h),
    /// minted through every replica: (secret, id).
    pub(super) async fn token(
        &self,
        role: Role,
        labels: &BTreeMap<String, String>,
        uses: u32,
    ) -> (String, String) {
        let r = self
            .client()
            .create_token(
                ADMIN,
                CreateTokenRequest {
                    kind: TokenKind::Bootstrap as i32,
                    role: role as i32,
                    labels: map_to_labels(labels),
                    max_uses: uses,
                    ttl_secs: 3600,
                },
            )
            .await
            .expect("create token");
        (r.token, r.token_id)
    }

    /// SIGKILLs replica `i` and waits for it to be gone.
    pub(super) async fn kill(&mut self, i: usize) {
        let mut child = self.all[i].child.take().expect("replica running");
        child.start_kill().expect("SIGKILL");
        tokio::time::timeout(DEADLINE, child.wait())
            .await
            .expect("a killed replica exits")
            .expect("wait");
    }

    /// Starts replica `i` again on its addresses and waits until it is
    /// ready and every replica counts all of them live again.
    pub(super) async fn restart(&mut self, i: usize) {
        self.spawn(i);
        self.until_ready(i).await;
        self.until_live(self.all.len()).await;
    }

    /// One series of replica `i`'s metrics (0 when absent or unreachable).
    pub(super) async fn metric(&self, i: usize, series: &str) -> f64 {
        match get(self.all[i].http, "/metrics").await {
            Some((_, body)) => metric(&body, series),
            None => 0.0,
        }
    }

    /// The lines of replica `i`'s metrics that start with `prefix`.
    pub(super) async fn series(&self, i: usize, prefix: &str) -> Vec<String> {
        let Some((_, body)) = get(self.all[i].http, "/metrics").await else {
            return Vec::new();
        };
        body.lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_string)
            .collect()
    }

    /// Replica `i`'s `/readyz` status (`None`: no answer within 5 s).
    pub(super) async fn readyz(&self, i: usize) -> Option<u16> {
        get(self.all[i].http, "/readyz")
            .await
            .map(|(status, _)| status)
    }

    /// Waits (bounded) until replica `i` answers `/readyz` with 200.
    async fn until_ready(&mut self, i: usize) {
        let end = Instant::now() + DEADLINE;
        loop {
            if get(self.all[i].http, "/readyz")
                .await
                .is_some_and(|(status, _)| status == 200)
            {
                return;
            }
            if let Some(Ok(Some(status))) = self.all[i].child.as_mut().map(Child::try_wait) {
                panic!("replica {i} exited ({status}) before it was ready");
            }
            assert!(Instant::now() < end, "replica {i} never became ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits (bounded) until every running replica counts `n` live ones
    /// (each renews its presence every 2 s).
    pub(super) async fn until_live(&self, n: usize) {
        let end = Instant::now() + DEADLINE;
        for i in (0..self.all.len()).filter(|&i| self.all[i].child.is_some()) {
            while self
                .metric(i, "agentmesh_control_plane_live_replicas")
                .await
                != n as f64
            {
                assert!(
                    Instant::now() < end,
                    "replica {i} never counted {n} live replicas"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

impl Drop for Replicas {
    /// A failing test shows what each replica logged last.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for (i, r) in self.all.iter().enumerate() {
            let text = std::fs::read_to_string(&r.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("--- replica {i} ({}), last lines of its log:", r.grpc);
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

/// `/path` of a replica that may be gone (killed) or frozen: `None` when
/// nothing answers within 5 s.
async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    try_http_get(addr, path, Duration::from_secs(5)).await
}
