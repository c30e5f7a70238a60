//! Connecting and migrating: the bounded pool (TLS through rustls when the
//! URL or `PGSSLMODE` asks for it), then the migrations under a
//! transaction-level advisory lock, so processes starting together migrate
//! once, the policy epoch made if there is none, and the signing keys
//! sealed with the current key-encryption key.

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use super::{LOCK_MIGRATE, PgOptions, PostgresStore, Tls, rows::int};
use crate::store::{Kek, StoreError, migrations};

impl PostgresStore {
    /// Connects with a pool of at most `pool_connections`, migrates (under
    /// an advisory lock) and seals signing keys not sealed with `kek` yet.
    pub async fn open(
        opts: PgOptions,
        pool_connections: usize,
        kek: Kek,
    ) -> Result<Self, StoreError> {
        // Every connection is checked with an empty query before it is
        // handed out again: `Fast` only sees a connection whose task has
        // already ended, and one that just failed (its backend terminated,
        // its socket reset) may not have yet, so the next operation would
        // fail on it too. One round trip per operation is the price.
        let mgr_config = ManagerConfig {
            recycling_method: RecyclingMethod::Verified,
        };
        let mgr = match &opts.tls {
            Tls::Disable => Manager::from_config(opts.config.clone(), NoTls, mgr_config),
            Tls::Verify(path) => {
                Manager::from_config(opts.config.clone(), PgOptions::rustls(path)?, mgr_config)
            }
        };
        let pool = Pool::builder(mgr)
            .max_size(pool_connections.max(1))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Config(format!("database pool: {e}")))?;
        let store = Self { pool, kek, opts };
        store.migrate().await?;
        store.ensure_epoch().await?;
        store.reseal_keys().await?;
        Ok(store)
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let (mut conn, ms) = self.conn().await?;
        let tx = conn.transaction().await?;
        Self::bound(&tx, ms).await?;
        // The second process starting together waits here, then finds the
        // schema in place.
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_MIGRATE])
            .await?;
        tx.batch_execute(migrations::VERSION_TABLE_POSTGRES).await?;
        let stored = tx
            .query_opt(
                "SELECT version, oldest_compatible FROM schema_version WHERE id = 1",
                &[],
            )
            .await?
            .map(|r| -> Result<(u32, u32), StoreError> {
                Ok((
                    int("schema_version", "version", r.get(0))?,
                    int("schema_version", "oldest_compatible", r.get(1))?,
                ))
            })
            .transpose()?;
        let found = stored.unwrap_or((0, 0));
        let steps = migrations::pending(found)?;
        if steps.is_empty() && stored.is_some() {
            return Ok(());
        }
        for m in &migrations::MIGRATIONS[steps.clone()] {
            if !m.postgres.trim().is_empty() {
                tx.batch_execute(m.postgres).await?;
            }
        }
        let version = found.0.max(steps.end as u32);
        let oldest =
            migrations::oldest_compatible(version.min(migrations::SCHEMA_VERSION)).max(found.1);
        tx.execute(
            "INSERT INTO schema_version (id, version, oldest_compatible) VALUES (1, $1, $2)
             ON CONFLICT (id) DO UPDATE SET version = excluded.version,
               oldest_compatible = excluded.oldest_compatible",
            &[&i64::from(version), &i64::from(oldest)],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }
}
