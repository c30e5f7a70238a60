//! How both backends encode what is not a plain number or byte string:
//! labels and addresses as JSON text (the same text on SQLite and
//! PostgreSQL, so `store copy` moves it unchanged), and the node columns in
//! the order both backends read them.

use std::collections::BTreeMap;

use super::StoreError;

pub(super) fn labels_json(l: &BTreeMap<String, String>) -> String {
    serde_json::to_string(l).unwrap_or_else(|_| "{}".into())
}

pub(super) fn parse_labels(
    table: &'static str,
    s: &str,
) -> Result<BTreeMap<String, String>, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt {
        table,
        what: format!("labels: {e}"),
    })
}

pub(super) fn parse_addrs(s: &str) -> Result<Vec<String>, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt {
        table: "router_leases",
        what: format!("addrs: {e}"),
    })
}

pub(super) const NODE_COLS: &str = "node_id, peer_id, role, token_kind, token_id, labels, enrolled_at, last_seen, cred_expires_at, revoked";
