//! The admin commands through the real binary, on both backends: `token
//! create` through the admin API (with request ids: a retried invocation
//! mints one token, a reused id with another request is refused), `token
//! list` (never a secret; a revoked token shows revoked), `node list` with
//! a member enrolled over the real protocol, `node revoke` (the member's
//! next refresh is refused), `key rotate` (one rotation per request id),
//! and `token revoke`, `node revoke` and `policy apply` retried under their
//! request id (the first answer again, nothing done twice, even after
//! another admin's apply).

use std::path::Path;

use agentmesh_proto::identity::Keypair;
use tonic::Code;

use crate::common::{
    ADMIN, TestDb,
    binary::{run, serve},
    client_at,
};

/// Web members are in group `web`.
const POLICY: &str = r#"format = 1

[groups]
payments = { labels = { team = "payments" } }
web = { labels = { team = "web" } }

[[owners]]
services = ["payments/*"]
groups = ["payments"]

[[grants]]
from = ["web"]
to = ["payments/api"]
"#;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p.display().to_string()
}

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// The binary with `args`, then the control plane's URL and admin token.
async fn cp(url: &str, admin: &str, args: &[&str]) -> Out {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--control-plane", url, "--admin-token-file", admin]);
    let out = run(&all, &[]).await;
    Out {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

/// `token create` through the API: (secret, token id).
async fn create(url: &str, admin: &str, extra: &[&str]) -> (String, String) {
    let mut args = vec![
        "token",
        "create",
        "--kind",
        "bootstrap",
        "--role",
        "member",
        "--label",
        "team=web",
    ];
    args.extend_from_slice(extra);
    let o = cp(url, admin, &args).await;
    assert!(o.ok, "{}", o.stderr);
    let id = o
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("token "))
        .and_then(|r| r.split_whitespace().next())
        .expect("token id on stderr")
        .to_string();
    (o.stdout.trim().to_string(), id)
}

fn json(o: &Out) -> Vec<serde_json::Value> {
    assert!(o.ok, "{}", o.stderr);
    serde_json::from_str::<serde_json::Value>(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", o.stdout))
        .as_array()
        .expect("an array")
        .clone()
}

async fn tokens_and_nodes_are_listed_and_revoked_through_the_binary(db: TestDb) {
    let dir = db.dir().to_path_buf();
    let admin = write(&dir, "admin.token", ADMIN);
    let policy = write(&dir, "policy.toml", POLICY);
    let served = serve(
        db.url(),
        &["--admin-token-file", &admin, "--policy", &policy],
        &db.binary_env(),
    )
    .await;
    let url = served.url.clone();

    let (secret_a, id_a) = create(&url, &admin, &["--max-uses", "2"]).await;
    let (secret_b, id_b) = create(&url, &admin, &[]).await;
    assert!(secret_a.starts_with("amt_") && secret_a != secret_b);

    // Text and JSON, one row per page: both tokens, never a secret.
    let o = cp(&url, &admin, &["token", "list", "--page-size", "1"]).await;
    assert!(o.ok, "{}", o.stderr);
    assert!(o.stdout.starts_with("TOKEN_ID"), "{}", o.stdout);
    assert!(
        o.stdout.contains(&id_a) && o.stdout.contains(&id_b),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("team=web") && o.stdout.contains("  web\n"),
        "{}",
        o.stdout
    );
    for secret in [&secret_a, &secret_b] {
        assert!(!o.stdout.contains(secret.as_str()) && !o.stderr.contains(secret.as_str()));
    }
    assert!(o.stderr.contains("2 token(s)"), "{}", o.stderr);
    let rows = json(
        &cp(
            &url,
            &admin,
            &["token", "list", "--json", "--page-size", "1"],
        )
        .await,
    );
    assert_eq!(rows.len(), 2);
    assert!(
        rows.iter()
            .all(|r| r["state"] == "active" && r["groups"][0] == "web")
    );

    // Revoke one: the list says so.
    let o = cp(
        &url,
        &admin,
        &["token", "revoke", &id_b, "--reason", "leaked"],
    )
    .await;
    assert!(o.ok, "{}", o.stderr);
    let rows = json(&cp(&url, &admin, &["token", "list", "--json"]).await);
    let b = rows
        .iter()
        .find(|r| r["token_id"] == id_b.as_str())
        .expect("b listed");
    assert_eq!(b["state"], "revoked");
    assert_eq!(b["revoked_reason"], "leaked");
    let a = rows
        .iter()
        .find(|r| r["token_id"] == id_a.as_str())
        .expect("a listed");
    assert_eq!(a["state"], "active");

    // A member enrolls over the real protocol; node list shows it.
    let member = client_at(&url);
    let key = Keypair::generate_ed25519();
    let peer = key.public().to_peer_id().to_string();
    let enrolled = member.enroll(&secret_a, &key).await.expect("enrolls");
    let cred = enrolled.credential.expect("credential");
    let rows = json(&cp(&url, &admin, &["node", "list", "--json"]).await);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["peer_id"], peer.as_str());
    assert_eq!(rows[0]["node_id"], enrolled.node_id.as_str());
    assert_eq!(rows[0]["token_id"], id_a.as_str());
    assert_eq!(rows[0]["labels"]["team"], "web");
    assert_eq!(rows[0]["groups"][0], "web");
    assert_eq!(rows[0]["revoked"], false);
    member
        .refresh(&cred, &key)
        .await
        .expect("refreshes while enrolled");

    // node revoke: listed as revoked, and its next refresh is refused.
    let o = cp(&url, &admin, &["node", "revoke", "not-a-peer-id"]).await;
    assert!(!o.ok && o.stderr.contains("not a PeerId"), "{}", o.stderr);
    let o = cp(
        &url,
        &admin,
        &["node", "revoke", &peer, "--reason", "stolen"],
    )
    .await;
    assert!(o.ok, "{}", o.stderr);
    assert!(
        o.stdout.contains(&format!("node {peer} revoked")),
        "{}",
        o.stdout
    );
    let o = cp(&url, &admin, &["node", "list"]).await;
    assert!(o.ok, "{}", o.stderr);
    let line = o
        .stdout
        .lines()
        .find(|l| l.contains(&peer))
        .expect("listed");
    assert!(line.contains("  revoked  "), "{line}");
    let refused = member.refresh(&cred, &key).await.expect_err("refused");
    let code = refused.status().map(|s| s.code());
    assert!(
        matches!(code, Some(Code::PermissionDenied | Code::Unauthenticated)),
        "{refused}"
    );

    // A wrong admin token lists nothing.
    let wrong = write(&dir, "wrong.token", "wrong-admin-token-0000");
    let o = cp(&url, &wrong, &["node", "list"]).await;
    assert!(
        !o.ok && o.stderr.contains("Unauthenticated"),
        "{}",
        o.stderr
    );
    assert!(served.terminate().await.success());
}

async fn a_retried_request_id_does_the_work_once(db: TestDb) {
    let dir = db.dir().to_path_buf();
    let admin = write(&dir, "admin.token", ADMIN);
    let served = serve(db.url(), &["--admin-token-file", &admin], &db.binary_env()).await;
    let url = served.url.clone();
    let tokens = "SELECT COUNT(*) FROM tokens";

    // Every invocation has a request id of its own, printed.
    let o = cp(
        &url,
        &admin,
        &["token", "create", "--kind", "bootstrap", "--role", "member"],
    )
    .await;
    assert!(o.ok && o.stderr.contains("request id cli-"), "{}", o.stderr);
    assert_eq!(db.count(tokens).await, 1);

    // The same id twice (a retry after a lost answer): one token, and the
    // retry gets the first answer, secret included.
    let again = ["--request-id", "retry-me-1", "--max-uses", "3"];
    let first = create(&url, &admin, &again).await;
    let second = create(&url, &admin, &again).await;
    assert_eq!(first, second);
    assert_eq!(db.count(tokens).await, 2);
    assert_eq!(db.count("SELECT COUNT(*) FROM admin_requests").await, 2);

    // The id with another request: refused, nothing minted.
    let o = cp(
        &url,
        &admin,
        &[
            "token",
            "create",
            "--kind",
            "bootstrap",
            "--role",
            "member",
            "--max-uses",
            "4",
            "--request-id",
            "retry-me-1",
        ],
    )
    .await;
    assert!(!o.ok, "{}", o.stdout);
    assert!(
        o.stderr.contains("InvalidArgument") && o.stderr.contains("new request id"),
        "{}",
        o.stderr
    );
    assert_eq!(db.count(tokens).await, 2);

    // A rotation retried with its id rotates once.
    let keys = "SELECT COUNT(*) FROM signing_keys";
    let before = db.count(keys).await;
    let served_keys = client_at(&url);
    let held = served_keys.get_keys().await.expect("keys");
    let rotate = ["key", "rotate", "--request-id", "rot-1"];
    let a = cp(&url, &admin, &rotate).await;
    let after_a = served_keys.get_keys().await.expect("keys");
    let b = cp(&url, &admin, &rotate).await;
    assert!(a.ok && b.ok, "{} {}", a.stderr, b.stderr);
    assert!(a.stdout.starts_with("signing key k-"), "{}", a.stdout);
    assert_eq!(a.stdout, b.stdout);
    assert_eq!(db.count(keys).await, before + 1);
    // GetKeys's generation rose with the rotation, and not with its retry.
    assert_eq!(after_a.epoch, held.epoch);
    assert!(after_a.generation > held.generation, "{after_a:?}");
    assert_eq!(served_keys.get_keys().await.expect("keys"), after_a);
    // A bad id is refused before anything is done.
    let o = cp(
        &url,
        &admin,
        &["key", "rotate", "--request-id", "no spaces"],
    )
    .await;
    assert!(!o.ok && o.stderr.contains("request-id"), "{}", o.stderr);
    assert_eq!(db.count(keys).await, before + 1);
    assert!(served.terminate().await.success());
}

/// The request id an invocation printed on stderr.
fn printed_id(o: &Out) -> String {
    o.stderr
        .lines()
        .find_map(|l| l.strip_prefix("request id "))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no request id printed: {}", o.stderr))
        .to_string()
}

/// Waits (bounded: 5 s) until the wall clock's second is past `t`: a
/// revocation made now ends later than one made at `t`.
async fn until_second_after(t: i64) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while agentmesh_proto::unix_now() <= t {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the clock stands still"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn revocations_and_applies_retried_with_their_request_id_are_done_once(db: TestDb) {
    let dir = db.dir().to_path_buf();
    let admin = write(&dir, "admin.token", ADMIN);
    let policy = write(&dir, "policy.toml", POLICY);
    let served = serve(
        db.url(),
        &["--admin-token-file", &admin, "--policy", &policy],
        &db.binary_env(),
    )
    .await;
    let url = served.url.clone();

    // token revoke: an id of its own per invocation; retried with it, the
    // first answer and one revocation; the id with another reason refused.
    let (_, token_id) = create(&url, &admin, &["--max-uses", "3"]).await;
    let first = cp(
        &url,
        &admin,
        &["token", "revoke", &token_id, "--reason", "leaked"],
    )
    .await;
    assert!(first.ok, "{}", first.stderr);
    let id = printed_id(&first);
    until_second_after(agentmesh_proto::unix_now()).await;
    let retry = [
        "token",
        "revoke",
        &token_id,
        "--reason",
        "leaked",
        "--request-id",
        &id,
    ];
    let again = cp(&url, &admin, &retry).await;
    assert!(again.ok, "{}", again.stderr);
    assert_eq!(first.stdout, again.stdout, "the first answer");
    let other = [
        "token",
        "revoke",
        &token_id,
        "--reason",
        "other",
        "--request-id",
        &id,
    ];
    let o = cp(&url, &admin, &other).await;
    assert!(
        !o.ok && o.stderr.contains("InvalidArgument") && o.stderr.contains("new request id"),
        "{}",
        o.stderr
    );
    assert_eq!(db.count("SELECT COUNT(*) FROM token_revocations").await, 1);

    // node revoke: a member enrolled over the real protocol; the retry a
    // second later answers the first end, and the end stored is not moved.
    let (secret, _) = create(&url, &admin, &[]).await;
    let key = Keypair::generate_ed25519();
    client_at(&url)
        .enroll(&secret, &key)
        .await
        .expect("enrolls");
    let peer = key.public().to_peer_id().to_string();
    let until = "SELECT until FROM revocations";
    let first = cp(
        &url,
        &admin,
        &["node", "revoke", &peer, "--request-id", "nr-1"],
    )
    .await;
    assert!(first.ok, "{}", first.stderr);
    let stored = db.count(until).await;
    until_second_after(agentmesh_proto::unix_now()).await;
    let again = cp(
        &url,
        &admin,
        &["node", "revoke", &peer, "--request-id", "nr-1"],
    )
    .await;
    assert!(again.ok, "{}", again.stderr);
    assert_eq!(first.stdout, again.stdout, "the first answer");
    assert_eq!(db.count(until).await, stored, "the retry extended nothing");

    // policy apply: a retry after another admin's apply answers the first
    // version and leaves the later one in force (without the id it would
    // apply the first text again, on top).
    let wider = write(
        &dir,
        "wider.toml",
        &POLICY.replace("[\"web\"]", "[\"web\", \"payments\"]"),
    );
    let versions = "SELECT COUNT(*) FROM policies";
    let before = db.count(versions).await;
    let a = cp(
        &url,
        &admin,
        &["policy", "apply", &wider, "--request-id", "pa-1"],
    )
    .await;
    assert!(
        a.ok && a.stdout.contains("as policy version"),
        "{} {}",
        a.stdout,
        a.stderr
    );
    let b = cp(&url, &admin, &["policy", "apply", &policy]).await;
    assert!(
        b.ok && b.stdout.contains("as policy version"),
        "{} {}",
        b.stdout,
        b.stderr
    );
    let retried = cp(
        &url,
        &admin,
        &["policy", "apply", &wider, "--request-id", "pa-1"],
    )
    .await;
    assert!(retried.ok, "{}", retried.stderr);
    assert_eq!(a.stdout, retried.stdout, "the first answer");
    assert_eq!(
        db.count(versions).await,
        before + 2,
        "applied twice, not three times"
    );
    let shown = cp(&url, &admin, &["policy", "show"]).await;
    assert_eq!(shown.stdout, POLICY, "the later apply stays in force");
    assert!(served.terminate().await.success());
}

on_both!(
    #[tokio::test]
    tokens_and_nodes_are_listed_and_revoked_through_the_binary,
    a_retried_request_id_does_the_work_once,
    revocations_and_applies_retried_with_their_request_id_are_done_once;
);
