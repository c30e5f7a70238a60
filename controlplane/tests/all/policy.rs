//! The policy on both backends: applied over gRPC (a good one, then a bad
//! one refused with its line and column while the good one stays), carried
//! signed in the directory (re-signed after a key rotation), taken up by a
//! second control plane on the same database; the real binary's `policy
//! check|apply|show|diff`; and the start-up rules with the real binary (a
//! fresh database denies every call and says so, a database with members
//! and no policy refuses to start until `--policy FILE` or
//! `--policy-allow-all`, a bad `--policy` file applies nothing).

use std::{path::Path, time::Duration};

use agentmesh_controlplane::{Client, ClientError, spawn};
use agentmesh_policy::ALLOW_ALL;
use agentmesh_proto::{
    credential::Trust,
    identity::Keypair,
    pb::{
        controlplane::ApplyPolicyRequest,
        credential::{PolicyDocument, Role, TokenKind},
    },
    policy::verify_policy,
};
use tonic::Code;

use crate::common::{
    self, ADMIN, TestDb,
    binary::{run, serve},
    client, client_at, token,
};

/// Payments may provide `payments/*`; web may call `payments/api`.
const GOOD: &str = r#"format = 1

[groups]
payments = { labels = { team = "payments" } }
web = { labels = { team = "web" } }

[[owners]]
services = ["payments/*"]
groups = ["payments"]

[[grants]]
from = ["web"]
to = ["payments/api"]

[[tests]]
from = { labels = { team = "web" } }
call = "payments/api"
expect = "allow"
"#;

/// GOOD with web also granted `payments/db`.
const WIDER: &str = r#"format = 1

[groups]
payments = { labels = { team = "payments" } }
web = { labels = { team = "web" } }

[[owners]]
services = ["payments/*"]
groups = ["payments"]

[[grants]]
from = ["web"]
to = ["payments/api", "payments/db"]

[[tests]]
from = { labels = { team = "web" } }
call = "payments/api"
expect = "allow"
"#;

/// A grant to services no owner rule lets anyone provide (line 8).
const BAD: &str = r#"format = 1

[groups]
web = { labels = { team = "web" } }

[[grants]]
from = ["web"]
to = ["nobody/*"]
"#;

const WAIT: Duration = Duration::from_secs(60);

fn code(r: Result<impl std::fmt::Debug, ClientError>) -> Code {
    match r {
        Ok(v) => panic!("expected a refusal, got {v:?}"),
        Err(e) => e.status().map_or(Code::Unknown, |s| s.code()),
    }
}

fn apply(text: &str) -> ApplyPolicyRequest {
    ApplyPolicyRequest {
        text: text.into(),
        dry_run: false,
        author: "tester".into(),
    }
}

/// The directory's policy, verified against the keys the control plane serves.
async fn directory_policy(c: &Client) -> PolicyDocument {
    let keys = c.get_keys().await.expect("keys");
    let signed = c
        .get_directory()
        .await
        .expect("directory")
        .policy
        .expect("the directory carries the policy");
    verify_policy(&signed, &Trust::new(&keys)).expect("signed by a served key")
}

async fn a_good_policy_applies_and_a_bad_one_is_refused_whole(db: TestDb) {
    let mut cfg = db.config();
    cfg.policy_allow_all = false;
    let h = spawn(cfg).await.expect("starts");
    let c = client(&h);

    // Fresh: deny-all, version 0, said on /info and in the metrics.
    let doc = directory_policy(&c).await;
    assert_eq!(doc.version, 0);
    let none = agentmesh_policy::Policy::parse(&doc.text).expect("the deny-all text parses");
    assert_eq!(none.summary().grants, 0);
    let (status, info) = common::http_get(h.http_addr(), "/info").await;
    assert_eq!(status, 200);
    assert!(info.contains("every call is denied"), "{info}");
    let m = common::metrics(&h).await;
    assert_eq!(
        common::metric(&m, "agentmesh_control_plane_policy_version "),
        Some(0.0)
    );

    // A good policy: version 1, in the next directory at once.
    let r = c.apply_policy(ADMIN, apply(GOOD)).await.expect("applies");
    assert!(r.applied);
    assert_eq!(r.version, 1);
    assert_eq!(r.summary.expect("summary").grants, 1);
    let doc = directory_policy(&c).await;
    assert_eq!((doc.version, doc.text.as_str()), (1, GOOD));
    assert_eq!(doc.epoch, r.epoch);

    // A bad one: refused with every problem's line and column; nothing applied.
    let e = c
        .apply_policy(ADMIN, apply(BAD))
        .await
        .expect_err("refused");
    let s = e.status().expect("a status");
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(s.message().contains("line 8, column"), "{}", s.message());
    assert!(s.message().contains("nobody/*"), "{}", s.message());
    let shown = c.get_policy(ADMIN, 0).await.expect("get");
    assert_eq!((shown.version, shown.text.as_str()), (1, GOOD));
    assert_eq!(shown.applied_by, "tester (admin token)");
    assert_eq!(shown.applied_from, "127.0.0.1");
    assert_eq!(directory_policy(&c).await.version, 1);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM policies").await,
        1,
        "the refused text was never stored"
    );

    // The same text again: nothing stored. A dry run checks only.
    let again = c.apply_policy(ADMIN, apply(GOOD)).await.expect("unchanged");
    assert_eq!((again.applied, again.version), (false, 1));
    let dry = ApplyPolicyRequest {
        dry_run: true,
        ..apply(WIDER)
    };
    let dry = c.apply_policy(ADMIN, dry).await.expect("checks");
    assert_eq!((dry.applied, dry.version), (false, 1));
    let dry_bad = ApplyPolicyRequest {
        dry_run: true,
        ..apply(BAD)
    };
    assert_eq!(
        code(c.apply_policy(ADMIN, dry_bad).await),
        Code::InvalidArgument
    );

    // Version 2; version 1 is kept, marked replaced.
    assert_eq!(
        c.apply_policy(ADMIN, apply(WIDER))
            .await
            .expect("v2")
            .version,
        2
    );
    let old = c.get_policy(ADMIN, 1).await.expect("v1 kept");
    assert_eq!((old.text.as_str(), old.current_version), (GOOD, 2));
    assert!(old.replaced_at_unix_secs > 0);
    assert_eq!(code(c.get_policy(ADMIN, 99).await), Code::NotFound);

    // GET /policy, read-only and without a token.
    let (status, body) = common::http_get(h.http_addr(), "/policy").await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["version"], 2);
    assert_eq!(v["text"], WIDER);
    assert_eq!(v["summary"]["grants"], 1);
    assert_eq!(v["epoch"].as_str().map(str::len), Some(16));
    let (status, body) = common::http_get(h.http_addr(), "/policy?version=1").await;
    assert_eq!(status, 200);
    assert!(body.contains("\"state\":\"replaced\""), "{body}");
    let (status, _) = common::http_get(h.http_addr(), "/policy?version=77").await;
    assert_eq!(status, 404);

    // Admin only: no token, a wrong token.
    assert_eq!(
        code(c.apply_policy("wrong-admin-token-0000", apply(GOOD)).await),
        Code::Unauthenticated
    );
    assert_eq!(
        code(c.get_policy("wrong-admin-token-0000", 0).await),
        Code::Unauthenticated
    );
    let m = common::metrics(&h).await;
    let applies = |r: &str| {
        common::metric(
            &m,
            &format!("agentmesh_control_plane_policy_applies_total{{result=\"{r}\"}}"),
        )
    };
    assert_eq!(applies("applied"), Some(2.0));
    assert_eq!(applies("unchanged"), Some(1.0));
    assert_eq!(applies("refused"), Some(2.0), "the apply and the dry run");
    assert_eq!(
        common::metric(&m, "agentmesh_control_plane_policy_version "),
        Some(2.0)
    );
    h.shutdown().await;
}

async fn a_second_control_plane_on_the_database_takes_up_an_applied_version(db: TestDb) {
    let mut cfg = db.config();
    cfg.policy_check_interval_ms = 100;
    let a = spawn(cfg.clone()).await.expect("first");
    let b = spawn(cfg).await.expect("second");
    let (ca, cb) = (client(&a), client(&b));
    assert_eq!(
        directory_policy(&cb).await.text,
        ALLOW_ALL,
        "--policy-allow-all, applied once"
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM policies").await, 1);
    let r = ca
        .apply_policy(ADMIN, apply(GOOD))
        .await
        .expect("applies on a");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let doc = directory_policy(&cb).await;
        if doc.version == r.version {
            assert_eq!(doc.text, GOOD);
            assert_eq!(doc.epoch, r.epoch, "one database, one epoch");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "b still serves version {} after {WAIT:?}",
            doc.version
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let m = common::metrics(&b).await;
    assert_eq!(
        common::metric(&m, "agentmesh_control_plane_policy_version "),
        Some(r.version as f64)
    );
    a.shutdown().await;
    b.shutdown().await;
}

async fn the_directory_policy_is_signed_again_after_a_key_rotation(db: TestDb) {
    let mut cfg = db.config();
    cfg.key_publish_ahead_secs = 0;
    let h = spawn(cfg).await.expect("starts");
    let c = client(&h);
    let before = directory_policy(&c).await;
    let rotated = c.rotate_key_now(ADMIN).await.expect("rotates");
    assert_ne!(before.key_id, rotated.key_id);
    // The next directory (its cache is at most --directory-cache-ms old)
    // carries the same version signed with the new key.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let doc = directory_policy(&c).await;
        if doc.key_id == rotated.key_id {
            assert_eq!((doc.version, doc.epoch), (before.version, before.epoch));
            assert!(doc.issued_at_unix_secs >= before.issued_at_unix_secs);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never re-signed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    h.shutdown().await;
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p.display().to_string()
}

fn text(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

async fn the_binary_checks_applies_shows_and_diffs_policies(db: TestDb) {
    let env = db.binary_env();
    let dir = db.dir().to_path_buf();
    let admin = write(&dir, "admin.token", ADMIN);
    let (good, wider, bad) = (
        write(&dir, "good.toml", GOOD),
        write(&dir, "wider.toml", WIDER),
        write(&dir, "bad.toml", BAD),
    );

    // check: no server; exit status and FILE:LINE:COLUMN.
    let out = run(&["policy", "check", &good], &[]).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("ok: 2 group(s), 1 owner rule(s), 1 grant(s), 1 test(s)"),
        "{stdout}"
    );
    let out = run(&["policy", "check", &bad], &[]).await;
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("{bad}:8:")), "{stderr}");
    let out = run(
        &[
            "policy",
            "check",
            &dir.join("missing.toml").display().to_string(),
        ],
        &[],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));

    let served = serve(db.url(), &["--admin-token-file", &admin], &env).await;
    let cp = |args: &[&str]| {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend([
            "--control-plane".into(),
            served.url.clone(),
            "--admin-token-file".into(),
            admin.clone(),
        ]);
        all
    };
    let call = |args: Vec<String>| async move {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&refs, &[]).await
    };

    // apply, then show round-trips the exact text.
    let out = call(cp(&["policy", "apply", &good, "--author", "alice"])).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("as policy version 1"), "{stdout}");
    let out = call(cp(&["policy", "show"])).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, GOOD);
    assert!(stderr.contains("policy version 1 (in force)"), "{stderr}");
    assert!(stderr.contains("by alice (admin token)"), "{stderr}");

    // diff against a file: the changed grant, as a unified diff.
    let out = call(cp(&["policy", "diff", &wider])).await;
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.starts_with("--- version 1\n"), "{stdout}");
    assert!(stdout.contains("\n-to = [\"payments/api\"]\n"), "{stdout}");
    assert!(
        stdout.contains("\n+to = [\"payments/api\", \"payments/db\"]\n"),
        "{stdout}"
    );
    let out = call(cp(&["policy", "diff", &good])).await;
    let (stdout, stderr) = text(&out);
    assert!(
        stdout.is_empty() && stderr.contains("no differences"),
        "{stdout}{stderr}"
    );

    // A bad file is refused before anything is sent; the good one stays.
    let out = call(cp(&["policy", "apply", &bad])).await;
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains(&format!("{bad}:8:")), "{stderr}");
    // Applying the same file again stores nothing.
    let out = call(cp(&["policy", "apply", &good])).await;
    let (stdout, _) = text(&out);
    assert!(stdout.contains("unchanged"), "{stdout}");
    assert_eq!(db.count("SELECT COUNT(*) FROM policies").await, 1);

    // Version 2; diff without a file shows what it changed; show --version 1.
    let out = call(cp(&["policy", "apply", &wider])).await;
    assert!(
        text(&out).0.contains("as policy version 2"),
        "{:?}",
        text(&out)
    );
    let out = call(cp(&["policy", "diff"])).await;
    let (stdout, _) = text(&out);
    assert!(
        stdout.starts_with("--- version 1\n+++ version 2\n"),
        "{stdout}"
    );
    let out = call(cp(&["policy", "show", "--version", "1"])).await;
    let (stdout, stderr) = text(&out);
    assert_eq!(stdout, GOOD);
    assert!(stderr.contains("version 2 is in force"), "{stderr}");
    let out = call(cp(&["policy", "show", "--version", "9"])).await;
    assert!(!out.status.success());
    assert!(text(&out).1.contains("NotFound"), "{:?}", text(&out));

    // A wrong admin token is refused.
    let wrong = write(&dir, "wrong.token", "wrong-admin-token-0000");
    let out = run(
        &[
            "policy",
            "show",
            "--control-plane",
            &served.url,
            "--admin-token-file",
            &wrong,
        ],
        &[],
    )
    .await;
    assert!(!out.status.success());
    assert!(text(&out).1.contains("Unauthenticated"), "{:?}", text(&out));
    assert!(served.terminate().await.success());
}

/// Serves the binary on `db` with `args` until it logs its addresses;
/// returns it (for the cases expected to start).
async fn serve_with(db: &TestDb, args: &[&str]) -> common::binary::Served {
    serve(db.url(), args, &db.binary_env()).await
}

/// Runs the binary serving on `db` with `args`, expecting it to refuse to
/// start: returns its exit status and stderr.
async fn refused_start(db: &TestDb, args: &[&str]) -> (Option<i32>, String) {
    let mut all = vec![
        "--db",
        db.url(),
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
    ];
    all.extend_from_slice(args);
    let out = run(&all, &db.binary_env()).await;
    (out.status.code(), text(&out).1)
}

async fn a_database_with_members_and_no_policy_refuses_to_start_until_told(db: TestDb) {
    let dir = db.dir().to_path_buf();
    let admin = write(&dir, "admin.token", ADMIN);
    let (good, bad) = (write(&dir, "good.toml", GOOD), write(&dir, "bad.toml", BAD));

    // A fresh database: deny-all, said in the log and on /info.
    let served = serve_with(&db, &["--admin-token-file", &admin]).await;
    let (_, info) = common::http_get(served.http_addr, "/info").await;
    assert!(info.contains("every call is denied"), "{info}");
    assert_eq!(
        directory_policy(&client_at(&served.url)).await.version,
        0,
        "deny-all is distributed like any policy"
    );
    // A member enrolls while no policy is applied (as in a mesh from before
    // policies), and the process stops.
    let tok = client_at(&served.url)
        .create_token(
            ADMIN,
            agentmesh_proto::pb::controlplane::CreateTokenRequest {
                kind: TokenKind::Bootstrap as i32,
                role: Role::Member as i32,
                labels: vec![],
                max_uses: 1,
                ttl_secs: 600,
            },
        )
        .await
        .expect("token")
        .token;
    client_at(&served.url)
        .enroll(&tok, &Keypair::generate_ed25519())
        .await
        .expect("enrolls");
    assert!(served.terminate().await.success());
    assert_eq!(db.count("SELECT COUNT(*) FROM policies").await, 0);

    // Without a flag it refuses, saying which flags choose.
    let (code, stderr) = refused_start(&db, &[]).await;
    assert_ne!(code, Some(0));
    assert!(
        stderr.contains("1 enrolled node(s) and no policy"),
        "{stderr}"
    );
    assert!(
        stderr.contains("--policy FILE") && stderr.contains("--policy-allow-all"),
        "{stderr}"
    );
    // A bad file: refused whole with its lines and columns; nothing applied.
    let (code, stderr) = refused_start(&db, &["--policy", &bad]).await;
    assert_ne!(code, Some(0));
    assert!(stderr.contains(&format!("{bad}:8:")), "{stderr}");
    assert!(stderr.contains("nothing was applied"), "{stderr}");
    assert_eq!(db.count("SELECT COUNT(*) FROM policies").await, 0);
    // Both flags at once: refused by the command line.
    let (code, _) = refused_start(&db, &["--policy", &good, "--policy-allow-all"]).await;
    assert_ne!(code, Some(0));

    // --policy-allow-all: allow-all is version 1.
    let served = serve_with(&db, &["--policy-allow-all"]).await;
    let (_, body) = common::http_get(served.http_addr, "/policy").await;
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["version"], 1);
    assert_eq!(v["text"], ALLOW_ALL);
    assert!(
        v["state"]
            .as_str()
            .is_some_and(|s| s.starts_with("allow-all")),
        "{v}"
    );
    assert!(served.terminate().await.success());
    // Now it starts without a flag, and the flag changes nothing.
    assert!(serve_with(&db, &[]).await.terminate().await.success());
    assert!(
        serve_with(&db, &["--policy-allow-all"])
            .await
            .terminate()
            .await
            .success()
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM policies").await, 1);

    // --policy FILE: applied when it differs, not again when it does not.
    let served = serve_with(&db, &["--policy", &good]).await;
    assert_eq!(directory_policy(&client_at(&served.url)).await.version, 2);
    assert!(served.terminate().await.success());
    let served = serve_with(&db, &["--policy", &good]).await;
    let doc = directory_policy(&client_at(&served.url)).await;
    assert_eq!((doc.version, doc.text.as_str()), (2, GOOD));
    assert!(served.terminate().await.success());
    assert_eq!(db.count("SELECT COUNT(*) FROM policies").await, 2);
    let applied_by = db
        .count("SELECT COUNT(*) FROM policies WHERE version = 2 AND applied_by = 'start-up (--policy)'")
        .await;
    assert_eq!(applied_by, 1);

    // A newer file (a new ConfigMap) is applied; a replica restarted with
    // the older one (an old pod in a rolling update) leaves it in force.
    let newer = write(&dir, "newer.toml", &format!("# the next revision\n{GOOD}"));
    let served = serve_with(&db, &["--policy", &newer]).await;
    assert_eq!(directory_policy(&client_at(&served.url)).await.version, 3);
    assert!(served.terminate().await.success());
    let served = serve_with(&db, &["--policy", &good]).await;
    let doc = directory_policy(&client_at(&served.url)).await;
    assert_eq!(doc.version, 3, "an older file never undoes a newer policy");
    assert!(doc.text.starts_with("# the next revision"), "{}", doc.text);
    let (_, metrics) = common::http_get(served.http_addr, "/metrics").await;
    assert_eq!(
        common::metric(
            &metrics,
            "agentmesh_control_plane_policy_applies_total{result=\"superseded\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert!(served.terminate().await.success());
    assert_eq!(db.count("SELECT COUNT(*) FROM policies").await, 3);
}

on_both!(
    #[tokio::test]
    a_good_policy_applies_and_a_bad_one_is_refused_whole,
    the_directory_policy_is_signed_again_after_a_key_rotation,
    the_binary_checks_applies_shows_and_diffs_policies,
    a_database_with_members_and_no_policy_refuses_to_start_until_told;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_second_control_plane_on_the_database_takes_up_an_applied_version;
);

/// The embedded API: `Handle::apply_policy` checks like the RPC.
#[tokio::test]
async fn the_handle_applies_and_refuses_like_the_rpc() {
    let dir = tempfile::tempdir().expect("tempdir");
    let h = common::start(dir.path()).await;
    assert!(h.policy().is_allow_all());
    assert!(h.apply_policy(BAD).await.is_err());
    assert_eq!(h.policy().version, 1);
    let done = h.apply_policy(GOOD).await.expect("applies");
    assert_eq!(done.version(), 2);
    assert_eq!(h.policy().text, GOOD);
    let _ = token(&h, TokenKind::Bootstrap, Role::Member, &[], 1).await;
    h.shutdown().await;
}
