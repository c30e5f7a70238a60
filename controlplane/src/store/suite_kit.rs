//! What every two-backend store suite (`suite`, `policy_suite`,
//! `token_revocation_suite`, ...) starts from: the backend a case runs on
//! and a database of its own there (a SQLite file in a temp dir, or a
//! fresh PostgreSQL database from `testing`), with its own key-encryption
//! key; and the rows and reap policy several suites share.

use std::{collections::BTreeMap, sync::Arc};

use super::*;

/// A signing key row `id` (fixed bytes, no end yet).
pub(super) fn key(id: &str, active_from: i64) -> SigningKeyRow {
    SigningKeyRow {
        key_id: id.into(),
        secret: (0..64).map(|i| (i * 7 + 3) as u8).collect(),
        public: vec![2; 32],
        active_from,
        verify_until: 0,
    }
}

/// A bootstrap token of role member, no labels, 10 uses, until `expires_at`.
pub(super) fn member_token(id: &str, expires_at: i64) -> TokenRow {
    TokenRow {
        token_id: id.into(),
        kind: agentmesh_proto::pb::credential::TokenKind::Bootstrap as i32,
        role: agentmesh_proto::pb::credential::Role::Member as i32,
        labels: BTreeMap::new(),
        max_uses: 10,
        uses: 0,
        created_at: 1,
        expires_at,
    }
}

/// Ten days' retention for every table that has one: a reap at an instant
/// soon after the rows were written deletes only what ends by its own
/// instant (revocations, keys past their grace, leases).
/// `text` applied at `at` by an operator (`unless_replaced` off).
pub(super) fn new_policy(text: &str, at: i64) -> NewPolicy {
    NewPolicy {
        text: text.into(),
        applied_at: at,
        applied_by: "tester".into(),
        applied_from: "10.0.0.9".into(),
        unless_replaced: false,
    }
}

pub(super) fn reap_policy() -> ReapPolicy {
    ReapPolicy {
        node_retention_secs: 10 * 86_400,
        ephemeral_retention_secs: 10 * 86_400,
        enrollment_retention_secs: 10 * 86_400,
        used_token_retention_secs: 10 * 86_400,
        policy_retention_secs: 10 * 86_400,
        admin_request_retention_secs: 10 * 86_400,
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// The other backend (a copy's destination).
    pub(super) fn other(self) -> Backend {
        match self {
            Backend::Sqlite => Backend::Postgres,
            Backend::Postgres => Backend::Sqlite,
        }
    }
}

/// One database and a way to open more stores on it.
pub(super) struct Target {
    pub(super) url: String,
    _dir: tempfile::TempDir,
    pub(super) kek: Kek,
}

impl Target {
    pub(super) async fn new(b: Backend) -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = match b {
            Backend::Sqlite => format!("sqlite://{}", dir.path().join("cp.db").display()),
            Backend::Postgres => testing::fresh_database().await?.url,
        };
        Some(Self {
            url,
            _dir: dir,
            kek: Kek::from_hex(&Kek::generate_hex()).expect("kek"),
        })
    }

    pub(super) async fn open(&self) -> Arc<dyn Store> {
        open(&OpenOptions {
            url: self.url.clone(),
            read_connections: 2,
            pool_connections: 4,
            kek: self.kek.clone(),
        })
        .await
        .expect("open store")
    }
}

/// Runs each named case (an `async fn(Backend)` of the invoking module)
/// as two tests, `sqlite::NAME` and `postgres::NAME`.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(super::Backend::Sqlite).await
            })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(super::Backend::Postgres).await
            })*
        }
    };
}
pub(super) use on_both;
