//! The binary as the ladder runs it: `agentmesh-hostile --json <attack>`
//! prints one line of JSON with the attack's name and counts. Against a
//! router address where nothing listens, every dial fails and is counted.

use std::process::Command;

#[test]
fn the_binary_prints_its_counts_as_one_json_line() {
    // A port nothing listens on: bind one, note it, let it go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let router = format!(
        "/ip4/127.0.0.1/tcp/{port}/p2p/12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_agentmesh-hostile"))
        .args([
            "--json",
            "router-auth",
            "--router",
            &router,
            "--source-ip",
            "127.0.0.66",
            "--peers",
            "2",
            "--duration-secs",
            "1",
        ])
        .output()
        .expect("run agentmesh-hostile");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).expect("json");
    assert_eq!(v["attack"], "router-auth");
    assert!(
        v["counts"]["dials_failed"].as_u64().is_some_and(|n| n >= 2),
        "{v}"
    );
    assert_eq!(v["counts"]["connections"], 0, "{v}");
}
