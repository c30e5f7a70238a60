//! `--pprof-addr` on each program (control plane, router, node), built with
//! the `pprof` feature as this package enables it: a CPU profile and a heap
//! profile fetched over HTTP decode as pprof protobuf and hold samples.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pprof::protos::{Message as _, Profile};

const CONTROL_PLANE: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-control-plane");
const ROUTER: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-router");
const NODE: &str = env!("CARGO_BIN_EXE_e2e-agentmesh-node");

/// jemalloc's heap profiling on from the start (the `_rjem_` prefix), one
/// sample per 16 KiB allocated on average so a small process has samples.
const MALLOC_CONF: &str = "prof:true,prof_active:true,lg_prof_sample:14";

fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], agentmesh_testkit::free_tcp_port()))
}

/// `GET path` over HTTP/1.0: (status, body), or None when nothing answers.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut data = Vec::new();
    s.read_to_end(&mut data).ok()?;
    let end = data.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&data[..end]);
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, data[end + 4..].to_vec()))
}

/// Waits (at most 60 s) until `GET path` answers 200.
fn wait_ok(addr: SocketAddr, path: &str, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if get(addr, path).is_some_and(|(s, _)| s == 200) {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited ({status}) before {path} answered");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{what}: {path} on {addr} did not answer 200 within 60 s");
}

fn spawn(program: &str, args: &[String]) -> Child {
    Command::new(program)
        .args(args)
        .env("_RJEM_MALLOC_CONF", MALLOC_CONF)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("starting a program")
}

fn token(dir: &Path, role: &str) -> String {
    let out = dir.join(format!("{role}-token"));
    let status = Command::new(CONTROL_PLANE)
        .args([
            "token",
            "create",
            "--kind",
            "bootstrap",
            "--role",
            role,
            "--out",
        ])
        .arg(&out)
        .arg(format!("--db=sqlite://{}/cp.db", dir.display()))
        .stdout(Stdio::null())
        .status()
        .expect("token create");
    assert!(status.success(), "token create --role {role}: {status}");
    out.display().to_string()
}

/// A profile's protobuf, gunzipped when it came gzipped.
fn decode(bytes: &[u8], what: &str) -> Profile {
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut out)
            .unwrap_or_else(|e| panic!("{what}: bad gzip: {e}"));
        out
    } else {
        bytes.to_vec()
    };
    Profile::parse_from_bytes(&raw).unwrap_or_else(|e| panic!("{what}: not pprof protobuf: {e}"))
}

/// A CPU profile (1 s, while `busy` is scraped so there is CPU to sample)
/// and a heap profile from `pprof`.
fn check_profiles(name: &str, pprof: SocketAddr, busy: SocketAddr) {
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u32;
            while !stop.load(Ordering::Relaxed) {
                if get(busy, "/metrics").is_some() {
                    n += 1;
                }
            }
            n
        })
    };
    let cpu = get(pprof, "/debug/pprof/profile?seconds=1");
    stop.store(true, Ordering::Relaxed);
    let scrapes = load.join().expect("the load thread");
    let (status, body) = cpu.unwrap_or_else(|| panic!("{name}: no CPU profile"));
    assert_eq!(
        status,
        200,
        "{name} CPU profile: {}",
        String::from_utf8_lossy(&body)
    );
    let p = decode(&body, &format!("{name} CPU profile"));
    assert!(
        !p.sample_type.is_empty(),
        "{name}: CPU profile without a sample type"
    );
    assert!(
        !p.sample.is_empty(),
        "{name}: CPU profile without samples ({scrapes} scrapes during it)"
    );

    let (status, body) =
        get(pprof, "/debug/pprof/heap").unwrap_or_else(|| panic!("{name}: no heap profile"));
    assert_eq!(
        status,
        200,
        "{name} heap profile: {}",
        String::from_utf8_lossy(&body)
    );
    let p = decode(&body, &format!("{name} heap profile"));
    assert!(
        !p.sample_type.is_empty(),
        "{name}: heap profile without a sample type"
    );
    assert!(!p.sample.is_empty(), "{name}: heap profile without samples");
}

#[test]
fn each_program_serves_cpu_and_heap_profiles() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let d = dir.path();
    let router_token = token(d, "router");
    let member_token = token(d, "member");
    let (grpc, http, cp_pprof) = (free_addr(), free_addr(), free_addr());
    let mut cp = spawn(
        CONTROL_PLANE,
        &[
            "--insecure".into(),
            format!("--db=sqlite://{}/cp.db", d.display()),
            format!("--grpc-addr={grpc}"),
            format!("--http-addr={http}"),
            format!("--pprof-addr={cp_pprof}"),
        ],
    );
    wait_ok(http, "/healthz", &mut cp, "control plane");
    let (r_metrics, r_pprof) = (free_addr(), free_addr());
    let mut router = spawn(
        ROUTER,
        &[
            format!("--control-plane=http://{grpc}"),
            format!("--token-file={router_token}"),
            format!("--key-path={}/router.key", d.display()),
            "--listen=/ip4/127.0.0.1/tcp/0".into(),
            format!("--metrics-addr={r_metrics}"),
            format!("--pprof-addr={r_pprof}"),
        ],
    );
    wait_ok(r_metrics, "/readyz", &mut router, "router");
    let (n_metrics, n_pprof) = (free_addr(), free_addr());
    let mut node = spawn(
        NODE,
        &[
            "run".into(),
            format!("--control-plane=http://{grpc}"),
            format!("--token-file={member_token}"),
            format!("--data-dir={}/node", d.display()),
            "--routers=1".into(),
            format!("--metrics-addr={n_metrics}"),
            format!("--pprof-addr={n_pprof}"),
        ],
    );
    wait_ok(n_metrics, "/readyz", &mut node, "node");

    check_profiles("control plane", cp_pprof, http);
    check_profiles("router", r_pprof, r_metrics);
    check_profiles("node", n_pprof, n_metrics);
    for mut c in [node, router, cp] {
        let _ = c.kill();
        let _ = c.wait();
    }
}
