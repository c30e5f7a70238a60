//! README.md's "A first walk through", run as written through the real
//! binaries: the block is read from the README and only its binary folder
//! (`B=target/release`) and ports are changed. A README edit that breaks the
//! walk-through breaks this test.

use std::os::unix::fs::symlink;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The walk-through must finish well within this (it polls for at most
/// 30 s for the token, waits at most 30 s for each node to be ready, and
/// the ping takes one call's budget at most).
const DEADLINE: Duration = Duration::from_secs(120);

/// The programs the walk-through runs, under the names it uses.
const PROGRAMS: [(&str, &str); 3] = [
    ("agentmesh-one", env!("CARGO_BIN_EXE_e2e-agentmesh-one")),
    ("agentmesh-node", env!("CARGO_BIN_EXE_e2e-agentmesh-node")),
    (
        "agentmesh-control-plane",
        env!("CARGO_BIN_EXE_e2e-agentmesh-control-plane"),
    ),
];

/// The shell blocks (```sh … ```) of the README section `heading`.
fn sh_blocks(readme: &str, heading: &str) -> Vec<String> {
    let start = readme
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("README has no section {heading:?}"));
    let rest = &readme[start + heading.len() + 2..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut blocks = Vec::new();
    let mut parts = section.split("```sh\n").skip(1);
    for part in parts.by_ref() {
        let end = part.find("\n```").expect("unterminated ```sh block");
        blocks.push(part[..end + 1].to_string());
    }
    blocks
}

/// The walk-through block with this machine's binaries and free ports.
fn script(block: &str, bin_dir: &Path) -> String {
    assert!(
        block.starts_with("B=target/release\n"),
        "the walk-through no longer starts with B=target/release:\n{block}"
    );
    let mut s = block.replacen("B=target/release", &format!("B={}", bin_dir.display()), 1);
    // Routers and their metrics on any free port (0); the control plane and
    // the backend on ports free now.
    for (port, with) in [
        ("7400", agentmesh_testkit::free_tcp_port()),
        ("7401", agentmesh_testkit::free_tcp_port()),
        ("9000", agentmesh_testkit::free_tcp_port()),
        ("7410", 0),
        ("7420", 0),
    ] {
        assert!(
            s.contains(port),
            "the walk-through no longer uses port {port}"
        );
        s = s.replace(port, &with.to_string());
    }
    s
}

#[test]
fn the_readme_walk_through_runs_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("reading README.md");
    let blocks = sh_blocks(&readme, "## A first walk through");
    assert_eq!(
        blocks.len(),
        2,
        "build block and walk-through block: {blocks:?}"
    );
    assert!(
        blocks[0].starts_with("cargo build --release"),
        "{}",
        blocks[0]
    );

    let dir = tempfile::tempdir().expect("walk-through set-up");
    let bin_dir = dir.path().join("bin");
    std::fs::create_dir(&bin_dir).expect("walk-through set-up");
    for (name, path) in PROGRAMS {
        symlink(path, bin_dir.join(name)).expect("walk-through set-up");
    }
    let script = script(&blocks[1], &bin_dir);
    let work = dir.path().join("work");
    std::fs::create_dir(&work).expect("walk-through set-up");

    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(&work)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so everything it started is stopped below
        // even if the script's own `kill` is never reached.
        .process_group(0)
        .spawn()
        .expect("walk-through set-up");
    let pgid = child.id();
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("walk-through set-up") {
            break Some(s);
        }
        if started.elapsed() > DEADLINE {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // Everything the walk-through started, whether or not it got to its
    // own `kill`.
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .status();
    let out = child.wait_with_output().expect("walk-through set-up");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let status = status.unwrap_or_else(|| {
        panic!("the walk-through ran past {DEADLINE:?}\nstdout:\n{stdout}\nstderr:\n{stderr}")
    });
    assert!(
        status.success(),
        "exit {status}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // The call's answer, from the backend through both members.
    assert!(
        stdout.lines().any(|l| l == "HELLO MESH"),
        "no HELLO MESH\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // `ping` names the route and the verdict (a refused or failed ping
    // exits non-zero, failing the script above).
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("upper granted by ") && l.contains(" via router ")),
        "no granted ping\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // The banner names the admin token, and `policy show` worked with it.
    assert!(stdout.contains("admin token"), "{stdout}");
    assert!(
        stdout.contains("allow"),
        "policy show printed no policy:\n{stdout}"
    );
    let token = std::fs::read_to_string(work.join("agentmesh-data/admin-token"))
        .expect("walk-through set-up");
    assert_eq!(token.trim().len(), 64, "a 256-bit hex admin token");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(work.join("agentmesh-data/admin-token"))
            .expect("walk-through set-up")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
}
