//! Policy versions and the epoch (see [`crate::store::policies`]). READ
//! COMMITTED does not serialise two applies, so an apply takes a
//! transaction-level advisory lock before it reads the version in force:
//! a second process applying at once waits, then numbers its version after
//! the first one's (and finds the text unchanged if it was the same).

use tokio_postgres::Row;

use super::{LOCK_POLICY, PostgresStore, Tx};
use crate::store::{
    AppliedPolicy, NewPolicy, PolicyHead, PolicyRow, StoreError,
    policies::{epoch_from, new_epoch, version_from, version_to},
};

const COLS: &str = "version, text, applied_at, applied_by, applied_from, replaced_at";

fn row_from(r: &Row) -> Result<PolicyRow, StoreError> {
    Ok(PolicyRow {
        version: version_from(r.get(0))?,
        text: r.get(1),
        applied_at: r.get(2),
        applied_by: r.get(3),
        applied_from: r.get(4),
        replaced_at: r.get(5),
    })
}

/// Replaces the epoch with a new random one in `tx`; returns it.
pub(super) async fn replace_epoch(tx: &Tx<'_>) -> Result<u64, StoreError> {
    let epoch = new_epoch();
    tx.execute(
        "INSERT INTO policy_epoch (id, epoch, created_at) VALUES (1, $1, $2)
         ON CONFLICT (id) DO UPDATE SET epoch = excluded.epoch, created_at = excluded.created_at",
        &[&epoch, &agentmesh_proto::unix_now()],
    )
    .await?;
    Ok(epoch_from(epoch))
}

/// Every kept version, oldest first (`store copy`).
pub(super) async fn read_policies(tx: &Tx<'_>) -> Result<Vec<PolicyRow>, StoreError> {
    tx.query(
        &format!("SELECT {COLS} FROM policies ORDER BY version"),
        &[],
    )
    .await?
    .iter()
    .map(row_from)
    .collect()
}

/// Writes one version as it is (`store copy`).
pub(super) async fn insert_policy(tx: &Tx<'_>, p: &PolicyRow) -> Result<(), StoreError> {
    tx.execute(
        &format!("INSERT INTO policies ({COLS}) VALUES ($1, $2, $3, $4, $5, $6)"),
        &[
            &version_to(p.version)?,
            &p.text,
            &p.applied_at,
            &p.applied_by,
            &p.applied_from,
            &p.replaced_at,
        ],
    )
    .await?;
    Ok(())
}

impl PostgresStore {
    /// Gives a database without an epoch its first; keeps an existing one.
    pub(super) async fn ensure_epoch(&self) -> Result<(), StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        tx.execute(
            "INSERT INTO policy_epoch (id, epoch, created_at) VALUES (1, $1, $2)
             ON CONFLICT (id) DO NOTHING",
            &[&new_epoch(), &agentmesh_proto::unix_now()],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

pub(super) async fn head(store: &PostgresStore) -> Result<PolicyHead, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    let r = tx
        .query_one(
            "SELECT (SELECT epoch FROM policy_epoch WHERE id = 1), (SELECT MAX(version) FROM policies)",
            &[],
        )
        .await?;
    let (epoch, version): (Option<i64>, Option<i64>) = (r.get(0), r.get(1));
    tx.commit().await?;
    Ok(PolicyHead {
        epoch: epoch_from(epoch.unwrap_or(0)),
        version: version.map(version_from).transpose()?,
    })
}

pub(super) async fn get(
    store: &PostgresStore,
    version: u64,
) -> Result<Option<PolicyRow>, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    let row = tx
        .query_opt(
            &format!("SELECT {COLS} FROM policies WHERE version = $1"),
            &[&version_to(version)?],
        )
        .await?;
    tx.commit().await?;
    row.as_ref().map(row_from).transpose()
}

pub(super) async fn apply(
    store: &PostgresStore,
    new: &NewPolicy,
) -> Result<AppliedPolicy, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    let done = apply_in(&tx, new).await?;
    tx.commit().await?;
    Ok(done)
}

/// An apply inside `tx`, under the policy lock: the next version, unless
/// the text is in force (or, [`NewPolicy::unless_replaced`], was replaced
/// since).
pub(super) async fn apply_in(tx: &Tx<'_>, new: &NewPolicy) -> Result<AppliedPolicy, StoreError> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_POLICY])
        .await?;
    let current = tx
        .query_opt(
            "SELECT version, text FROM policies ORDER BY version DESC LIMIT 1",
            &[],
        )
        .await?
        .map(|r| (r.get::<_, i64>(0), r.get::<_, String>(1)));
    if let Some((v, text)) = &current
        && *text == new.text
    {
        return Ok(AppliedPolicy::Unchanged(version_from(*v)?));
    }
    if let Some((head, _)) = &current
        && new.unless_replaced
    {
        let was: Option<i64> = tx
            .query_one(
                "SELECT MAX(version) FROM policies WHERE text = $1",
                &[&new.text],
            )
            .await?
            .get(0);
        if let Some(was) = was {
            let (was, head) = (version_from(was)?, version_from(*head)?);
            return Ok(AppliedPolicy::Superseded { was, head });
        }
    }
    let next = current.as_ref().map_or(1, |(v, _)| v + 1);
    if let Some((v, _)) = &current {
        tx.execute(
            "UPDATE policies SET replaced_at = $2 WHERE version = $1",
            &[v, &new.applied_at],
        )
        .await?;
    }
    tx.execute(
        &format!("INSERT INTO policies ({COLS}) VALUES ($1, $2, $3, $4, $5, NULL)"),
        &[
            &next,
            &new.text,
            &new.applied_at,
            &new.applied_by,
            &new.applied_from,
        ],
    )
    .await?;
    Ok(AppliedPolicy::Applied(version_from(next)?))
}

pub(super) async fn renew_epoch(store: &PostgresStore) -> Result<u64, StoreError> {
    let (mut conn, ms) = store.conn().await?;
    let tx = conn.transaction().await?;
    PostgresStore::bound(&tx, ms).await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_POLICY])
        .await?;
    let epoch = replace_epoch(&tx).await?;
    tx.commit().await?;
    Ok(epoch)
}
