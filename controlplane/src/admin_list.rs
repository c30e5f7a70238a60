//! `ListTokens` and `ListNodes`: what `token list` and `node list` show,
//! a page at a time. A page holds at most the rows asked for (default
//! [`DEFAULT_PAGE_ROWS`], at most [`MAX_LIST_ROWS`]) and at most
//! [`MAX_PAGE_BYTES`] encoded, so an answer always fits the 4 MiB a gRPC
//! client decodes whatever the labels; the next page starts after the
//! page's last id. Each row carries the groups the policy in force gives
//! its role and labels, so an operator sees what a token grants.

use std::collections::BTreeMap;

use agentmesh_policy::{Identity, Policy, Role as PolicyRole};
use agentmesh_proto::{
    identity::PeerId,
    pb::{
        controlplane::{
            ListNodesRequest, ListNodesResponse, ListTokensRequest, ListTokensResponse, NodeInfo,
            TokenInfo,
        },
        credential::{Label, Role},
    },
};
use prost::Message;

use crate::{
    state::State,
    status::ServiceError,
    store::{MAX_LIST_ROWS, NodeListing, TokenListing},
};

/// Rows in a page when the request does not say.
pub const DEFAULT_PAGE_ROWS: u32 = 100;
/// Most bytes of rows in one answer (a quarter of what a client decodes).
pub const MAX_PAGE_BYTES: usize = crate::grpc_server::MAX_RESPONSE_BYTES / 4;
/// Longest page token (an id) accepted, bytes.
pub const MAX_PAGE_TOKEN_LEN: usize = 256;

/// The rows to read and the id to start after.
fn page(page_size: u32, page_token: &str) -> Result<(u32, String), ServiceError> {
    if page_size > MAX_LIST_ROWS {
        return Err(ServiceError::Invalid(format!(
            "page_size must be at most {MAX_LIST_ROWS} (0: {DEFAULT_PAGE_ROWS})"
        )));
    }
    if page_token.len() > MAX_PAGE_TOKEN_LEN {
        return Err(ServiceError::Invalid(format!(
            "page_token is longer than {MAX_PAGE_TOKEN_LEN} bytes: pass next_page_token as received"
        )));
    }
    let rows = if page_size == 0 {
        DEFAULT_PAGE_ROWS
    } else {
        page_size
    };
    Ok((rows, page_token.to_string()))
}

/// Takes items while they fit [`MAX_PAGE_BYTES`] (always the first);
/// returns them and whether a next page may hold more (the store filled
/// the page, or the budget cut it).
fn fill<T: Message>(items: Vec<T>, asked: u32) -> (Vec<T>, bool) {
    let full = items.len() >= asked as usize;
    let mut out = Vec::with_capacity(items.len());
    let mut bytes = 0;
    for item in items {
        bytes += item.encoded_len();
        if !out.is_empty() && bytes > MAX_PAGE_BYTES {
            return (out, true);
        }
        out.push(item);
    }
    (out, full)
}

/// The names of the groups `role` and `labels` are in under `policy`.
fn groups(policy: &Policy, role: i32, labels: &BTreeMap<String, String>) -> Vec<String> {
    let role = match Role::try_from(role) {
        Ok(Role::Member) => PolicyRole::Member,
        Ok(Role::Router) => PolicyRole::Router,
        _ => return Vec::new(),
    };
    let g = policy.groups_of(&Identity { role, labels });
    policy
        .group_names(&g)
        .into_iter()
        .map(str::to_string)
        .collect()
}

fn labels(l: &BTreeMap<String, String>) -> Vec<Label> {
    l.iter()
        .map(|(k, v)| Label {
            key: k.clone(),
            value: v.clone(),
        })
        .collect()
}

fn token_info(policy: &Policy, t: TokenListing) -> TokenInfo {
    let (until, reason) = t.revoked.unwrap_or_default();
    TokenInfo {
        groups: groups(policy, t.row.role, &t.row.labels),
        labels: labels(&t.row.labels),
        token_id: t.row.token_id,
        kind: t.row.kind,
        role: t.row.role,
        max_uses: t.row.max_uses,
        uses: t.row.uses,
        created_at_unix_secs: t.row.created_at,
        expires_at_unix_secs: t.row.expires_at,
        last_used_at_unix_secs: t.last_used_at.unwrap_or(0),
        revoked_until_unix_secs: until,
        revoked_reason: reason,
    }
}

fn node_info(policy: &Policy, n: NodeListing) -> NodeInfo {
    NodeInfo {
        groups: groups(policy, n.row.role, &n.row.labels),
        labels: labels(&n.row.labels),
        // Stored PeerIds were parsed at enrollment; re-encode them so a
        // caller gets the canonical bytes.
        peer_id: PeerId::from_bytes(&n.row.peer_id)
            .map(|p| p.to_bytes())
            .unwrap_or(n.row.peer_id),
        node_id: n.row.node_id,
        role: n.row.role,
        token_kind: n.row.token_kind,
        token_id: n.row.token_id,
        enrolled_at_unix_secs: n.row.enrolled_at,
        last_seen_unix_secs: n.row.last_seen,
        credential_expires_at_unix_secs: n.row.cred_expires_at,
        revoked: n.row.revoked || n.revoked_until.is_some(),
        revoked_until_unix_secs: n.revoked_until.unwrap_or(0),
    }
}

impl State {
    /// `ListTokens`.
    pub async fn list_tokens(
        &self,
        req: ListTokensRequest,
    ) -> Result<ListTokensResponse, ServiceError> {
        let (rows, after) = page(req.page_size, &req.page_token)?;
        let listed = self
            .db
            .run(self.db.store().list_tokens(&after, rows))
            .await?;
        let policy = self.policy.get();
        let infos = listed
            .into_iter()
            .map(|t| token_info(&policy.policy, t))
            .collect();
        let (tokens, more) = fill(infos, rows);
        let next_page_token = match (more, tokens.last()) {
            (true, Some(t)) => t.token_id.clone(),
            _ => String::new(),
        };
        Ok(ListTokensResponse {
            tokens,
            next_page_token,
        })
    }

    /// `ListNodes`.
    pub async fn list_nodes(
        &self,
        req: ListNodesRequest,
    ) -> Result<ListNodesResponse, ServiceError> {
        let (rows, after) = page(req.page_size, &req.page_token)?;
        let listed = self
            .db
            .run(self.db.store().list_nodes(&after, rows))
            .await?;
        let policy = self.policy.get();
        let infos = listed
            .into_iter()
            .map(|n| node_info(&policy.policy, n))
            .collect();
        let (nodes, more) = fill(infos, rows);
        let next_page_token = match (more, nodes.last()) {
            (true, Some(n)) => n.node_id.clone(),
            _ => String::new(),
        };
        Ok(ListNodesResponse {
            nodes,
            next_page_token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_bounded_in_rows_and_bytes() {
        assert_eq!(
            page(0, "").expect("default"),
            (DEFAULT_PAGE_ROWS, String::new())
        );
        assert_eq!(page(7, "t1").expect("asked"), (7, "t1".to_string()));
        assert!(page(MAX_LIST_ROWS + 1, "").is_err());
        assert!(page(1, &"x".repeat(MAX_PAGE_TOKEN_LEN + 1)).is_err());
        // Rows of 300 KiB: the budget cuts the page, which says more may follow.
        let big = |id: &str| TokenInfo {
            token_id: id.into(),
            revoked_reason: "r".repeat(300 * 1024),
            ..Default::default()
        };
        let items: Vec<_> = (0..10).map(|i| big(&format!("t{i}"))).collect();
        let (kept, more) = fill(items, 10);
        assert_eq!(kept.len(), MAX_PAGE_BYTES / (300 * 1024));
        assert!(more);
        // A short page from the store is the last one.
        let (kept, more) = fill(vec![big("a")], 10);
        assert_eq!(kept.len(), 1);
        assert!(!more);
        // One row larger than the budget still goes (alone).
        let huge = TokenInfo {
            revoked_reason: "r".repeat(MAX_PAGE_BYTES + 1),
            ..Default::default()
        };
        let (kept, more) = fill(vec![huge.clone(), huge], 2);
        assert_eq!((kept.len(), more), (1, true));
    }
}
