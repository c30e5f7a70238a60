//! The admin commands over the gRPC admin API: `token list`, `node list`,
//! `node revoke`, `key rotate` and `token create --admin-token-file`.
//!
//! Listings fetch every page (`--page-size` rows per call, each call
//! retried within `--timeout-secs`) and print as they go: text, one row a
//! line under a header, or with `--json` one JSON array (ids, PeerIds and
//! timestamps-as-integers; never a token's secret, which the control plane
//! does not hold). The calls that are not idempotent carry a request id,
//! new per invocation unless `--request-id` names one, and are retried on
//! UNAVAILABLE and lost answers within the time budget with jitter: the
//! control plane answers a retry with the first answer.

use std::io::Write;

use agentmesh_proto::{
    identity::PeerId,
    pb::{
        controlplane::{CreateTokenRequest, NodeInfo, TokenInfo},
        credential::{Label, Role, TokenKind},
    },
    unix_now,
};

use crate::{
    client::{Client, ClientError, new_request_id},
    policy::cli::AdminArgs,
};

/// Default `--page-size`, rows per call.
pub const DEFAULT_PAGE_ROWS: u32 = 100;
/// Largest `--page-size` the control plane serves, rows per call.
pub const MAX_PAGE_ROWS: u32 = 1000;

/// Why an admin command failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminCliError {
    /// The admin token or CA file could not be read, or the URL is unusable.
    #[error("{0}")]
    Setup(String),
    /// The control plane refused, or could not be reached within the budget.
    #[error("{call}: {detail}")]
    Call {
        /// The gRPC method.
        call: &'static str,
        /// What happened.
        detail: String,
    },
    /// The command's own argument is unusable.
    #[error("{0}")]
    Argument(String),
    /// Writing the output failed (a closed pipe).
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
}

fn call_err(call: &'static str, e: ClientError) -> AdminCliError {
    let detail = match e.status() {
        Some(s) => format!("{:?}: {}", s.code(), s.message()),
        None => e.to_string(),
    };
    AdminCliError::Call { call, detail }
}

fn connect(admin: &AdminArgs) -> Result<(Client, String), AdminCliError> {
    admin
        .connect()
        .map_err(|e| AdminCliError::Setup(e.to_string()))
}

/// How a listing prints.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct ListArgs {
    /// Rows fetched per admin call, rows (1..=1000; default 100).
    #[arg(long, default_value_t = DEFAULT_PAGE_ROWS, value_parser = clap::value_parser!(u32).range(1..=MAX_PAGE_ROWS as i64))]
    pub page_size: u32,
    /// Print one JSON array instead of text (default: text).
    #[arg(long)]
    pub json: bool,
}

/// Writes a listing as text lines or as one JSON array, row by row.
struct Printer<W: Write> {
    out: W,
    json: bool,
    rows: usize,
}

impl<W: Write> Printer<W> {
    fn start(mut out: W, json: bool, header: &str) -> Result<Self, AdminCliError> {
        if json {
            write!(out, "[")?;
        } else {
            writeln!(out, "{header}")?;
        }
        Ok(Self { out, json, rows: 0 })
    }

    fn row(&mut self, text: String, json: serde_json::Value) -> Result<(), AdminCliError> {
        if self.json {
            let sep = if self.rows == 0 { "\n" } else { ",\n" };
            write!(self.out, "{sep}{json}")?;
        } else {
            writeln!(self.out, "{text}")?;
        }
        self.rows += 1;
        Ok(())
    }

    fn finish(mut self) -> Result<usize, AdminCliError> {
        if self.json {
            writeln!(self.out, "\n]")?;
        }
        self.out.flush()?;
        Ok(self.rows)
    }
}

fn labels_text(l: &[Label]) -> String {
    if l.is_empty() {
        return "-".into();
    }
    l.iter()
        .map(|l| format!("{}={}", l.key, l.value))
        .collect::<Vec<_>>()
        .join(",")
}

fn list_text(l: &[String]) -> String {
    if l.is_empty() {
        "-".into()
    } else {
        l.join(",")
    }
}

fn labels_json(l: &[Label]) -> serde_json::Value {
    l.iter()
        .map(|l| (l.key.clone(), serde_json::Value::from(l.value.clone())))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn role_name(r: i32) -> &'static str {
    match Role::try_from(r) {
        Ok(Role::Member) => "member",
        Ok(Role::Router) => "router",
        _ => "unspecified",
    }
}

fn kind_name(k: i32) -> &'static str {
    match TokenKind::try_from(k) {
        Ok(TokenKind::Bootstrap) => "bootstrap",
        Ok(TokenKind::Ephemeral) => "ephemeral",
        _ => "unspecified",
    }
}

/// What a token can still do at `now`.
pub fn token_state(t: &TokenInfo, now: i64) -> &'static str {
    if t.revoked_until_unix_secs != 0 {
        "revoked"
    } else if t.expires_at_unix_secs <= now {
        "expired"
    } else if t.uses >= t.max_uses {
        "used_up"
    } else {
        "active"
    }
}

fn token_row(t: &TokenInfo, now: i64) -> (String, serde_json::Value) {
    let state = token_state(t, now);
    let text = format!(
        "{}  {}  {}  {}/{}  {}  {}  {}  {}  {}",
        t.token_id,
        kind_name(t.kind),
        role_name(t.role),
        t.uses,
        t.max_uses,
        t.created_at_unix_secs,
        t.expires_at_unix_secs,
        state,
        labels_text(&t.labels),
        list_text(&t.groups),
    );
    let json = serde_json::json!({
        "token_id": t.token_id,
        "kind": kind_name(t.kind),
        "role": role_name(t.role),
        "labels": labels_json(&t.labels),
        "groups": t.groups,
        "uses": t.uses,
        "max_uses": t.max_uses,
        "created_at_unix_secs": t.created_at_unix_secs,
        "expires_at_unix_secs": t.expires_at_unix_secs,
        "last_used_at_unix_secs": t.last_used_at_unix_secs,
        "state": state,
        "revoked_until_unix_secs": t.revoked_until_unix_secs,
        "revoked_reason": t.revoked_reason,
    });
    (text, json)
}

fn peer_text(bytes: &[u8]) -> String {
    PeerId::from_bytes(bytes)
        .map_or_else(|_| format!("0x{}", hex::encode(bytes)), |p| p.to_string())
}

fn node_row(n: &NodeInfo) -> (String, serde_json::Value) {
    let peer = peer_text(&n.peer_id);
    let state = if n.revoked { "revoked" } else { "enrolled" };
    let text = format!(
        "{}  {}  {}  {}  {}  {}  {}  {}  {}",
        n.node_id,
        peer,
        role_name(n.role),
        n.token_id,
        n.enrolled_at_unix_secs,
        n.last_seen_unix_secs,
        state,
        labels_text(&n.labels),
        list_text(&n.groups),
    );
    let json = serde_json::json!({
        "node_id": n.node_id,
        "peer_id": peer,
        "role": role_name(n.role),
        "token_kind": kind_name(n.token_kind),
        "token_id": n.token_id,
        "labels": labels_json(&n.labels),
        "groups": n.groups,
        "enrolled_at_unix_secs": n.enrolled_at_unix_secs,
        "last_seen_unix_secs": n.last_seen_unix_secs,
        "credential_expires_at_unix_secs": n.credential_expires_at_unix_secs,
        "revoked": n.revoked,
        "revoked_until_unix_secs": n.revoked_until_unix_secs,
    });
    (text, json)
}

/// A page token that does not move on would loop forever: refuse it.
fn next_page(
    call: &'static str,
    prev: &str,
    next: String,
) -> Result<Option<String>, AdminCliError> {
    if next.is_empty() {
        return Ok(None);
    }
    if next == prev {
        return Err(AdminCliError::Call {
            call,
            detail: format!("the control plane answered page {prev:?} again"),
        });
    }
    Ok(Some(next))
}

/// `token list`: every token, page after page.
pub async fn token_list(list: ListArgs, admin: &AdminArgs) -> Result<(), AdminCliError> {
    let (client, token) = connect(admin)?;
    let header = "TOKEN_ID  KIND  ROLE  USES/MAX  CREATED  EXPIRES  STATE  LABELS  GROUPS";
    let mut p = Printer::start(std::io::stdout().lock(), list.json, header)?;
    let now = unix_now();
    let mut page = String::new();
    loop {
        let r = client
            .list_tokens(&token, list.page_size, &page)
            .await
            .map_err(|e| call_err("ListTokens", e))?;
        for t in &r.tokens {
            let (text, json) = token_row(t, now);
            p.row(text, json)?;
        }
        match next_page("ListTokens", &page, r.next_page_token)? {
            Some(next) => page = next,
            None => break,
        }
    }
    let n = p.finish()?;
    eprintln!("{n} token(s)");
    Ok(())
}

/// `node list`: every enrolled node, page after page.
pub async fn node_list(list: ListArgs, admin: &AdminArgs) -> Result<(), AdminCliError> {
    let (client, token) = connect(admin)?;
    let header = "NODE_ID  PEER_ID  ROLE  TOKEN_ID  ENROLLED  LAST_SEEN  STATE  LABELS  GROUPS";
    let mut p = Printer::start(std::io::stdout().lock(), list.json, header)?;
    let mut page = String::new();
    loop {
        let r = client
            .list_nodes(&token, list.page_size, &page)
            .await
            .map_err(|e| call_err("ListNodes", e))?;
        for n in &r.nodes {
            let (text, json) = node_row(n);
            p.row(text, json)?;
        }
        match next_page("ListNodes", &page, r.next_page_token)? {
            Some(next) => page = next,
            None => break,
        }
    }
    let n = p.finish()?;
    eprintln!("{n} node(s)");
    Ok(())
}

/// `node revoke PEER_ID`: the node is refused from then on (refresh,
/// leases, routers' admission) until its last credential has expired. One
/// revocation under one request id, retried within the budget.
pub async fn node_revoke(
    peer: &str,
    reason: &str,
    given_id: Option<String>,
    admin: &AdminArgs,
) -> Result<(), AdminCliError> {
    let peer_id: PeerId = peer.trim().parse().map_err(|_| {
        AdminCliError::Argument(format!(
            "{peer:?} is not a PeerId: give the PEER_ID column of `node list`"
        ))
    })?;
    let (client, token) = connect(admin)?;
    let id = request_id(given_id);
    eprintln!("request id {id} (give it as --request-id to retry this revocation)");
    let r = client
        .revoke_node_once(&token, &peer_id, reason, &id)
        .await
        .map_err(|e| call_err("RevokeNode", e))?;
    println!(
        "node {peer_id} revoked; the revocation is published until unix {}",
        r.until_unix_secs
    );
    Ok(())
}

/// `token revoke TOKEN_ID`: the token enrolls no one again and every
/// credential it led to is refused. One revocation under one request id,
/// retried within the budget.
pub async fn token_revoke(
    token_id: &str,
    reason: &str,
    given_id: Option<String>,
    admin: &AdminArgs,
) -> Result<(), AdminCliError> {
    let (client, token) = connect(admin)?;
    let id = request_id(given_id);
    eprintln!("request id {id} (give it as --request-id to retry this revocation)");
    let r = client
        .revoke_token_once(&token, token_id, reason, &id)
        .await
        .map_err(|e| call_err("RevokeToken", e))?;
    println!(
        "token {token_id} revoked; the revocation is published until unix {}",
        r.until_unix_secs
    );
    Ok(())
}

/// The request id of this invocation: the one given, or a new one.
fn request_id(given: Option<String>) -> String {
    given.unwrap_or_else(|| new_request_id("cli"))
}

/// `key rotate`: one rotation under one request id, retried within the budget.
pub async fn key_rotate(given_id: Option<String>, admin: &AdminArgs) -> Result<(), AdminCliError> {
    let (client, token) = connect(admin)?;
    let id = request_id(given_id);
    eprintln!("request id {id} (give it as --request-id to retry this rotation without a second)");
    let r = client
        .rotate_key_now_once(&token, &id)
        .await
        .map_err(|e| call_err("RotateKeyNow", e))?;
    println!(
        "signing key {} published; it signs from unix {}",
        r.key_id, r.active_from_unix_secs
    );
    Ok(())
}

/// A token minted through the admin API.
#[derive(Debug)]
pub struct Minted {
    /// The secret, shown once.
    pub token: String,
    /// Its id.
    pub token_id: String,
    /// Unix seconds.
    pub expires_at: i64,
}

/// `token create --admin-token-file`: one token under one request id,
/// retried within the budget.
pub async fn token_create(
    req: CreateTokenRequest,
    given_id: Option<String>,
    admin: &AdminArgs,
) -> Result<Minted, AdminCliError> {
    let (client, token) = connect(admin)?;
    let id = request_id(given_id);
    eprintln!("request id {id} (give it as --request-id to retry without minting a second token)");
    let r = client
        .create_token_once(&token, req, &id)
        .await
        .map_err(|e| call_err("CreateToken", e))?;
    Ok(Minted {
        token: r.token,
        token_id: r.token_id,
        expires_at: r.expires_at_unix_secs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_state_names_what_stops_it_first() {
        let mut t = TokenInfo {
            max_uses: 2,
            uses: 1,
            expires_at_unix_secs: 100,
            ..Default::default()
        };
        assert_eq!(token_state(&t, 50), "active");
        assert_eq!(token_state(&t, 100), "expired");
        t.uses = 2;
        assert_eq!(token_state(&t, 50), "used_up");
        t.revoked_until_unix_secs = 200;
        assert_eq!(token_state(&t, 50), "revoked");
    }

    #[test]
    fn json_output_is_one_array_and_text_has_a_header() {
        let t = TokenInfo {
            token_id: "t1".into(),
            labels: vec![Label {
                key: "zone".into(),
                value: "a".into(),
            }],
            max_uses: 1,
            expires_at_unix_secs: i64::MAX,
            ..Default::default()
        };
        let mut buf = Vec::new();
        let mut p = Printer::start(&mut buf, true, "H").expect("start");
        for _ in 0..2 {
            let (text, json) = token_row(&t, 0);
            p.row(text, json).expect("row");
        }
        assert_eq!(p.finish().expect("finish"), 2);
        let v: serde_json::Value = serde_json::from_slice(&buf).expect("valid JSON");
        assert_eq!(v[1]["token_id"], "t1");
        assert_eq!(v[0]["labels"]["zone"], "a");
        assert_eq!(v[0]["state"], "active");
        assert!(v[0].get("token").is_none(), "no secret field");
        let mut buf = Vec::new();
        let mut p = Printer::start(&mut buf, false, "H").expect("start");
        let (text, json) = token_row(&t, 0);
        p.row(text, json).expect("row");
        p.finish().expect("finish");
        let out = String::from_utf8(buf).expect("utf8");
        assert_eq!(out.lines().next(), Some("H"));
        assert!(
            out.contains("t1  bootstrap") || out.contains("t1  unspecified"),
            "{out}"
        );
        assert!(out.contains("zone=a"), "{out}");
    }

    #[test]
    fn a_page_token_that_does_not_move_on_is_refused() {
        assert_eq!(next_page("L", "", String::new()).expect("last"), None);
        assert_eq!(
            next_page("L", "", "b".into()).expect("first"),
            Some("b".into())
        );
        assert!(next_page("L", "b", "b".into()).is_err());
    }
}
