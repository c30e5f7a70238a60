//! The reaper's side: one batch of deletions in one transaction (the rules
//! are in [`crate::store::reap`], written in this dialect by
//! [`Rule::postgres_sql`](crate::store::reap::Rule::postgres_sql)) and the
//! row counts it reports.

use tokio_postgres::types::ToSql;

use super::PostgresStore;
use crate::store::{Deleted, ReapPolicy, StoreError, TABLES, reap};

pub(super) async fn reap_batch(
    store: &PostgresStore,
    now: i64,
    policy: &ReapPolicy,
    max_rows: u64,
) -> Result<Deleted, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    let mut left = max_rows;
    let mut out = Deleted::new();
    for r in reap::rules(now, policy) {
        let mut n = 0;
        if left > 0 {
            let limit = i64::try_from(left).unwrap_or(i64::MAX);
            let st = tx.prepare_cached(&r.postgres_sql()).await?;
            let mut args: Vec<&(dyn ToSql + Sync)> = vec![&limit];
            args.extend(r.args.iter().map(|a| a as &(dyn ToSql + Sync)));
            n = tx.execute(&st, &args).await?;
            left = left.saturating_sub(n);
        }
        out.push((r.table, r.reason, n));
    }
    tx.commit().await?;
    Ok(out)
}

pub(super) async fn counts(store: &PostgresStore) -> Result<Vec<(String, i64)>, StoreError> {
    let sql = TABLES
        .iter()
        .map(|t| format!("SELECT '{t}'::text, COUNT(*) FROM {t}"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    let st = tx.prepare_cached(&sql).await?;
    let rows = tx
        .query(&st, &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    tx.commit().await?;
    Ok(rows)
}
