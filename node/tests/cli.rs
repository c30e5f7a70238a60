//! The real `agentmesh-node` binary's command line: `--version` names the
//! git commit it was built from, and bad flags are refused with the flag's
//! name before anything starts.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_agentmesh-node");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("binary runs")
}

#[test]
fn version_prints_the_version_and_the_git_commit() {
    let out = run(&["--version"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "agentmesh-node {} (commit {})\n",
            env!("CARGO_PKG_VERSION"),
            agentmesh_runtime::cli::checkout_commit(std::path::Path::new(env!(
                "CARGO_MANIFEST_DIR"
            )))
        )
    );
}

#[test]
fn a_bad_flag_value_is_refused_with_the_flag_name() {
    let out = run(&["run", "--stream-inbound-queue-per-protocol", "0"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--stream-inbound-queue-per-protocol"), "{err}");
    let out = run(&["run", "--token-file", "/nonexistent/agentmesh-token"]);
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--token-file /nonexistent/agentmesh-token"),
        "{err}"
    );
}
