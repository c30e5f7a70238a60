//! `store copy`: every table of one database into another, empty one
//! (SQLite to PostgreSQL to move a mesh, or back), in one read of the
//! source and one transaction on the target; the row counts are checked
//! after. Signing keys are opened with the source's key-encryption key and
//! sealed with the target's. Stop the control plane on the source first:
//! writes after the read are not copied. Recorded admin requests (request
//! ids) are not copied either: they live a day, and a retry after a move is
//! a new request.

use super::{OpenOptions, StoreError, open};

/// Rows copied per table.
pub type Copied = Vec<(String, i64)>;

/// Copies every row of `from` into `to` (created and migrated if new; it
/// must hold no nodes, tokens, keys or policies). Returns the rows per
/// table. The target's policy history is a new epoch.
pub async fn copy(from: &OpenOptions, to: &OpenOptions) -> Result<Copied, StoreError> {
    if let super::DbUrl::Sqlite(path) =
        super::DbUrl::parse(&from.url).map_err(StoreError::Config)?
        && !path.is_file()
    {
        return Err(StoreError::Config(format!(
            "--from {}: {} does not exist",
            from.url,
            path.display()
        )));
    }
    let source = open(from).await?;
    let snap = source.snapshot().await?;
    let target = open(to).await?;
    target.restore(&snap).await?;
    let want = snap.counts();
    // Recorded admin requests are not copied (see `admin_requests`).
    let mut got: Vec<_> = target
        .counts()
        .await?
        .into_iter()
        .filter(|(t, _)| want.iter().any(|(w, _)| w == t))
        .collect();
    got.sort();
    let mut sorted = want.clone();
    sorted.sort();
    if got != sorted {
        return Err(StoreError::Query(format!(
            "copy finished with other row counts than the source: source {sorted:?}, target {got:?}"
        )));
    }
    Ok(want)
}
