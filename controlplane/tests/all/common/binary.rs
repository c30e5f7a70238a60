//! The real `agentmesh-control-plane` binary: one-shot commands (`token
//! create`, `backup`) and a serving process whose bound addresses are read
//! from its log. Every wait has a 60 s deadline; a child is killed when its
//! handle is dropped.

use std::{net::SocketAddr, process::Stdio, time::Duration};

use tokio::process::{Child, Command};

pub const BIN: &str = env!("CARGO_BIN_EXE_agentmesh-control-plane");

/// Runs the binary with `args` and `env` to its end.
pub async fn run(args: &[&str], env: &[(&str, String)]) -> std::process::Output {
    let out = Command::new(BIN)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("binary finishes within 60 s")
        .expect("binary runs")
}

/// A serving control-plane process.
pub struct Served {
    pub child: Child,
    /// Its public URL, as clients dial it.
    pub url: String,
    /// Its `/metrics`, `/readyz` listener.
    pub http_addr: SocketAddr,
    /// Its gRPC listener (what a client dials when the public URL is a
    /// logical name several replicas share).
    pub grpc_addr: SocketAddr,
}

/// Starts the binary serving `--db db` on loopback port 0 (plus `args`),
/// and waits for the log line naming its addresses.
pub async fn serve(db: &str, args: &[&str], env: &[(&str, String)]) -> Served {
    let mut child = Command::new(BIN)
        .args([
            "--db",
            db,
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("serve");
    let stderr = child.stderr.take().expect("stderr");
    let (url, http_addr, grpc_addr) = tokio::time::timeout(Duration::from_secs(60), async {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let after = |line: &str, key: &str| {
            line.split(key)
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_string)
        };
        let mut seen = Vec::new();
        while let Some(line) = lines.next_line().await.expect("read log") {
            if let (Some(url), Some(http), Some(grpc)) = (
                after(&line, "public_url="),
                after(&line, "http_addr="),
                after(&line, "grpc_addr="),
            ) {
                // The rest of the log goes nowhere: the pipe closes, which
                // the control plane must (and does) survive.
                let http = http.parse::<SocketAddr>().expect("http_addr");
                return (url, http, grpc.parse::<SocketAddr>().expect("grpc_addr"));
            }
            seen.push(line);
        }
        panic!(
            "control plane exited before logging its address:\n{}",
            seen.join("\n")
        );
    })
    .await
    .expect("started within 60 s");
    Served {
        child,
        url,
        http_addr,
        grpc_addr,
    }
}

impl Served {
    /// The gRPC address as a URL to dial.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.grpc_addr)
    }

    /// Sends `signal` (`TERM`, `STOP`, `CONT`) to the process.
    pub async fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("pid").to_string();
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .await
            .expect("kill runs");
        assert!(sent.success(), "kill -{signal} {pid}");
    }

    /// SIGTERM, then the exit status (within 60 s).
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        self.signal("TERM").await;
        tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .expect("stops within 60 s of SIGTERM")
            .expect("wait")
    }
}

/// A bootstrap member token of `max_uses` uses, made by `token create` (a
/// process of its own, as an operator would) on the database at `db`.
pub async fn member_token(db: &str, max_uses: u32, env: &[(&str, String)]) -> String {
    let uses = max_uses.to_string();
    let args = [
        "token",
        "create",
        "--db",
        db,
        "--kind",
        "bootstrap",
        "--role",
        "member",
        "--max-uses",
        &uses,
    ];
    let out = run(&args, env).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf8")
        .trim()
        .to_string()
}

/// Waits (bounded: 30 s) until every one of `served` counts `n` live
/// replicas (a heartbeat every 2 s).
pub async fn until_live_replicas(served: &[&Served], n: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for s in served {
        loop {
            let (_, body) = super::http_get(s.http_addr, "/metrics").await;
            if super::metric(&body, "agentmesh_control_plane_live_replicas") == Some(n) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never counted {n} replicas: {body}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
