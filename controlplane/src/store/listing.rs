//! What the admin listings read: tokens and nodes a page at a time, in id
//! order, each with its revocation. A page starts after the last id of the
//! previous one (keyset paging: no offset to skip, so every page costs the
//! same and rows added meanwhile are neither skipped nor repeated).

use super::{NodeRow, TokenRow};

/// Most rows one listing call reads, whatever it asks.
pub const MAX_LIST_ROWS: u32 = 1000;

/// A token as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenListing {
    /// The row (no secret: the table holds only its digest).
    pub row: TokenRow,
    /// Its last enrollment, Unix seconds.
    pub last_used_at: Option<i64>,
    /// Its revocation: until when it is published, and why.
    pub revoked: Option<(i64, String)>,
}

/// A node as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeListing {
    /// The row.
    pub row: NodeRow,
    /// Until when a revocation of its PeerId is published, if one is.
    pub revoked_until: Option<i64>,
}

/// The SQL of a token page, `?1` the last id seen and `?2` the limit
/// (SQLite's placeholders; PostgreSQL's are these with `$`).
pub(super) const TOKEN_PAGE: &str =
    "SELECT t.token_id, t.kind, t.role, t.labels, t.max_uses, t.uses, t.created_at,
        t.expires_at, t.last_used_at, r.until, r.reason
     FROM tokens t LEFT JOIN token_revocations r ON r.token_id = t.token_id
     WHERE t.token_id > ?1 ORDER BY t.token_id LIMIT ?2";

/// The SQL of a node page (see [`TOKEN_PAGE`]); the node's columns are
/// [`super::columns::NODE_COLS`] in order, then the revocation's `until`.
pub(super) const NODE_PAGE: &str =
    "SELECT n.node_id, n.peer_id, n.role, n.token_kind, n.token_id, n.labels,
        n.enrolled_at, n.last_seen, n.cred_expires_at, n.revoked, r.until
     FROM nodes n LEFT JOIN revocations r ON r.peer_id = n.peer_id
     WHERE n.node_id > ?1 ORDER BY n.node_id LIMIT ?2";

/// `sql` with PostgreSQL's placeholders.
pub(super) fn postgres(sql: &str) -> String {
    sql.replace('?', "$")
}
