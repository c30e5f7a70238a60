//! Operations on the database without a running server: `token create`,
//! `backup`, `store copy` and `store new-policy-epoch` (each safe while a
//! control plane is serving the same database: SQLite's WAL and busy
//! timeout, `VACUUM INTO` from a read-only connection; PostgreSQL's
//! transactions).

use std::path::Path;

use agentmesh_proto::unix_now;

use crate::{
    admin::TokenSpec,
    status::ServiceError,
    store::{
        self, DbUrl, KEK_ENV, Kek, OpenOptions, StoreError, TokenRow, copy::Copied, resolve_kek,
    },
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

fn env_kek() -> Option<String> {
    std::env::var(KEK_ENV).ok()
}

/// Opens `db` for an operation that never touches signing keys: the KEK is
/// used when one is at hand (so keys are resealed as the server would), and
/// not required on PostgreSQL.
async fn open_for_tokens(db: &str) -> Result<std::sync::Arc<dyn store::Store>, OfflineError> {
    let url = DbUrl::parse(db).map_err(OfflineError::Invalid)?;
    let kek = match (&url, env_kek()) {
        (DbUrl::Postgres(_), None) => Kek::absent(),
        (_, env) => resolve_kek(db, None, env.as_deref(), None)?,
    };
    Ok(store::open(&OpenOptions {
        url: db.to_string(),
        read_connections: 1,
        pool_connections: 2,
        kek,
    })
    .await?)
}

/// Mints a token into the database at `db`.
pub async fn create_token(db: &str, spec: TokenSpec) -> Result<MintedToken, OfflineError> {
    spec.validate().map_err(|e| match e {
        ServiceError::Invalid(m) => OfflineError::Invalid(m),
        other => OfflineError::Invalid(other.to_string()),
    })?;
    let store = open_for_tokens(db).await?;
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
    store.create_token(&tokens::digest(&token), &row).await?;
    Ok(MintedToken {
        token,
        token_id,
        expires_at: row.expires_at,
    })
}

/// Copies the SQLite database at `db` into the new file `to` (consistent
/// while serving; read-only, never migrating; the copy created 0600).
pub async fn backup(db: &str, to: &Path) -> Result<(), OfflineError> {
    let path = match DbUrl::parse(db).map_err(OfflineError::Invalid)? {
        DbUrl::Sqlite(p) => p,
        DbUrl::Postgres(_) => {
            return Err(OfflineError::Invalid(
                "a PostgreSQL database is backed up with pg_dump (see docs/storage.md)".into(),
            ));
        }
    };
    if !path.is_file() {
        return Err(OfflineError::Invalid(format!(
            "--db {db}: {} does not exist",
            path.display()
        )));
    }
    let to = to.to_path_buf();
    tokio::task::spawn_blocking(move || store::backup_sqlite_file(&path, &to))
        .await
        .map_err(|e| StoreError::Task(e.to_string()))??;
    Ok(())
}

/// What `store copy` needs.
#[derive(Debug, Clone, Default)]
pub struct CopySpec {
    /// Source database URL.
    pub from: String,
    /// Target database URL (empty, or new).
    pub to: String,
    /// The source's KEK file (default: for SQLite the `.kek` beside it, for
    /// PostgreSQL [`KEK_ENV`]).
    pub from_kek_file: Option<std::path::PathBuf>,
    /// The target's KEK file (default: [`KEK_ENV`], or beside a SQLite target).
    pub to_kek_file: Option<std::path::PathBuf>,
}

/// Copies every table of `spec.from` into `spec.to`; returns rows per table.
pub async fn copy(spec: &CopySpec) -> Result<Copied, OfflineError> {
    let env = env_kek();
    // The environment's KEK is the target's: a SQLite source keeps using
    // the key beside its file unless told otherwise.
    let from_env = match DbUrl::parse(&spec.from).map_err(OfflineError::Invalid)? {
        DbUrl::Sqlite(_) => None,
        DbUrl::Postgres(_) => env.as_deref(),
    };
    let from_kek = resolve_kek(&spec.from, spec.from_kek_file.as_deref(), from_env, None)?;
    let to_kek = resolve_kek(&spec.to, spec.to_kek_file.as_deref(), env.as_deref(), None)?;
    let open = |url: &str, kek| OpenOptions {
        url: url.to_string(),
        read_connections: 1,
        pool_connections: 2,
        kek,
    };
    Ok(store::copy::copy(&open(&spec.from, from_kek), &open(&spec.to, to_kek)).await?)
}

/// Gives the database at `db` a new policy epoch (after a restore from a
/// dump, which carries the old one); returns it.
pub async fn new_policy_epoch(db: &str) -> Result<u64, OfflineError> {
    let store = open_for_tokens(db).await?;
    Ok(store.new_policy_epoch().await?)
}
