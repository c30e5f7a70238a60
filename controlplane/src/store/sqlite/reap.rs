//! The reaper's side: one batch of deletions in one transaction (the rules
//! are in [`crate::store::reap`]) and the row counts it reports.

use rusqlite::TransactionBehavior;

use super::Inner;
use crate::store::{Deleted, ReapPolicy, StoreError, TABLES, reap};

impl Inner {
    pub(super) fn reap_batch(
        &self,
        now: i64,
        policy: &ReapPolicy,
        max_rows: u64,
    ) -> Result<Deleted, StoreError> {
        let mut conn = self.writer.get()?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = reap::batch(&tx, now, policy, max_rows)?;
        tx.commit()?;
        Ok(out)
    }

    pub(super) fn counts(&self) -> Result<Vec<(String, i64)>, StoreError> {
        let sql = TABLES
            .iter()
            .map(|t| format!("SELECT '{t}', COUNT(*) FROM {t}"))
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        let conn = self.readers.get()?;
        let mut st = conn.prepare_cached(&sql)?;
        let rows = st
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }
}
