//! One reap batch: at most `max_rows` deletions in one
//! transaction, so the writer is held for one batch, never for a whole
//! backlog (after a long outage a table can hold 100k stale rows; enrollment
//! gets the writer back between batches).
//!
//! Neither bundled SQLite nor PostgreSQL has `DELETE … LIMIT`, so each rule
//! deletes the keys a limited `SELECT` picks (SQLite's rowid, PostgreSQL's
//! primary key); the conditions use the tables' indexes where the tables
//! grow with the fleet (`nodes.last_seen`, `enrollment_requests.at`).

use rusqlite::{Transaction, params_from_iter};

use super::{DELETE_REASONS, Deleted, ReapPolicy, StoreError};

/// One thing the reaper deletes: `cond` binds `?2` and on (`?1` is the limit).
pub(super) struct Rule {
    pub(super) table: &'static str,
    pub(super) reason: &'static str,
    cond: &'static str,
    pub(super) args: Vec<i64>,
}

impl Rule {
    /// The `DELETE` for this rule in PostgreSQL's dialect (`$n`
    /// placeholders, the table's primary key instead of a rowid).
    pub(super) fn postgres_sql(&self) -> String {
        let pk = match self.table {
            "nodes" => "node_id",
            "enrollment_requests" => "id",
            "tokens" => "token_id",
            "signing_keys" => "key_id",
            "policies" => "version",
            "token_revocations" => "token_id",
            "admin_requests" => "request_id",
            _ => "peer_id",
        };
        format!(
            "DELETE FROM {t} WHERE {pk} IN (SELECT {pk} FROM {t} WHERE {c} LIMIT $1)",
            t = self.table,
            c = self.cond.replace('?', "$")
        )
    }
}

/// The rules at `now`, in [`DELETE_REASONS`] order.
pub(super) fn rules(now: i64, p: &ReapPolicy) -> [Rule; 11] {
    let ephemeral = agentmesh_proto::pb::credential::TokenKind::Ephemeral as i64;
    let rule = |table, reason, cond, args| Rule {
        table,
        reason,
        cond,
        args,
    };
    [
        rule(
            "nodes",
            "ephemeral_lapsed",
            "token_kind = ?2 AND last_seen < ?3",
            vec![ephemeral, now - p.ephemeral_retention_secs],
        ),
        rule(
            "nodes",
            "lapsed",
            "last_seen < ?2",
            vec![now - p.node_retention_secs],
        ),
        rule(
            "enrollment_requests",
            "expired",
            "at < ?2",
            vec![now - p.enrollment_retention_secs],
        ),
        // A revoked token stays while its revocation does, so enrolling
        // with it is refused as revoked, not as unknown.
        rule(
            "tokens",
            "expired",
            "expires_at <= ?2 AND token_id NOT IN (SELECT token_id FROM token_revocations)",
            vec![now],
        ),
        rule(
            "tokens",
            "used_up",
            "uses >= max_uses AND COALESCE(last_used_at, created_at) < ?2",
            vec![now - p.used_token_retention_secs],
        ),
        rule("router_leases", "expired", "expires_at <= ?2", vec![now]),
        rule("revocations", "expired", "until <= ?2", vec![now]),
        rule(
            "signing_keys",
            "grace_ended",
            "verify_until != 0 AND verify_until <= ?2",
            vec![now],
        ),
        // The version in force has no `replaced_at`: never reaped.
        rule(
            "policies",
            "replaced",
            "replaced_at IS NOT NULL AND replaced_at < ?2",
            vec![now - p.policy_retention_secs],
        ),
        rule("token_revocations", "expired", "until <= ?2", vec![now]),
        // A retry after this finds no record and is done again.
        rule(
            "admin_requests",
            "expired",
            "created_at < ?2",
            vec![now - p.admin_request_retention_secs],
        ),
    ]
}

/// Deletes at most `max_rows` rows in SQLite's `tx`, rule after rule; every rule
/// gets an entry, zero when the batch was already full.
pub(super) fn batch(
    tx: &Transaction<'_>,
    now: i64,
    policy: &ReapPolicy,
    max_rows: u64,
) -> Result<Deleted, StoreError> {
    let mut left = max_rows;
    let mut out = Deleted::with_capacity(DELETE_REASONS.len());
    for r in rules(now, policy) {
        let mut n = 0;
        if left > 0 {
            let sql = format!(
                "DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} WHERE {c} LIMIT ?1)",
                t = r.table,
                c = r.cond
            );
            let limit = i64::try_from(left).unwrap_or(i64::MAX);
            let args = std::iter::once(limit).chain(r.args);
            n = tx.prepare_cached(&sql)?.execute(params_from_iter(args))? as u64;
            left = left.saturating_sub(n);
        }
        out.push((r.table, r.reason, n));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_follow_the_reasons_metrics_are_created_for() {
        let p = ReapPolicy {
            node_retention_secs: 1,
            ephemeral_retention_secs: 1,
            enrollment_retention_secs: 1,
            used_token_retention_secs: 1,
            policy_retention_secs: 1,
            admin_request_retention_secs: 1,
        };
        let got: Vec<_> = rules(0, &p).iter().map(|r| (r.table, r.reason)).collect();
        assert_eq!(got, DELETE_REASONS);
    }
}
