//! Operations on the database without a running server: `token create` and
//! `backup` (both safe while a control plane is serving the same file: WAL,
//! busy timeout, `VACUUM INTO`).

use std::path::Path;

use agentmesh_proto::unix_now;

use crate::{
    admin::TokenSpec,
    config::sqlite_path,
    status::ServiceError,
    store::{SqliteStore, Store, StoreError, TokenRow},
    tokens,
};

/// Why an offline operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// Bad `--db` or token values.
    #[error("{0}")]
    Invalid(String),
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A token minted offline, printed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MintedToken {
    /// The secret (only its SHA-256 is stored).
    pub token: String,
    /// Public id.
    pub token_id: String,
    /// Unix seconds.
    pub expires_at: i64,
}

/// Mints a token into the database at `db` (`sqlite://PATH`). Blocking.
pub fn create_token(db: &str, spec: TokenSpec) -> Result<MintedToken, OfflineError> {
    spec.validate().map_err(|e| match e {
        ServiceError::Invalid(m) => OfflineError::Invalid(m),
        other => OfflineError::Invalid(other.to_string()),
    })?;
    let store = SqliteStore::open(&sqlite_path(db).map_err(OfflineError::Invalid)?)?;
    let now = unix_now();
    let (token, token_id) = tokens::generate();
    let row = TokenRow {
        token_id: token_id.clone(),
        kind: spec.kind as i32,
        role: spec.role as i32,
        labels: spec.labels,
        max_uses: spec.max_uses,
        uses: 0,
        created_at: now,
        expires_at: now + spec.ttl_secs as i64,
    };
    store.create_token(&tokens::digest(&token), &row)?;
    Ok(MintedToken {
        token,
        token_id,
        expires_at: row.expires_at,
    })
}

/// Copies the database at `db` into the new file `to` (consistent while serving). Blocking.
pub fn backup(db: &str, to: &Path) -> Result<(), OfflineError> {
    let path = sqlite_path(db).map_err(OfflineError::Invalid)?;
    if !path.is_file() {
        return Err(OfflineError::Invalid(format!(
            "--db {db}: {} does not exist",
            path.display()
        )));
    }
    let store = SqliteStore::open(&path)?;
    store.backup_to(to)?;
    Ok(())
}
