//! The command line of `agentmesh-control-plane`: serve (default), `token
//! create`, `backup`, `store`, `policy`. Serve flags are exactly the fields of [`Config`]
//! (`Config` derives `clap::Args`: each field's doc is its flag's help).
//! New subcommands go in `Cmd`.

use std::{collections::BTreeMap, path::PathBuf};

use crate::{
    Config, SpawnError, admin::TokenSpec, clock::TokioClock, config::DEFAULT_DB, offline,
    spawn_with,
};
use agentmesh_runtime::watchdog;
use prometheus_client::registry::Registry;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The server did not start.
    #[error("starting the control plane: {0}")]
    Spawn(#[from] SpawnError),
    /// `token create` or `backup` failed.
    #[error(transparent)]
    Offline(#[from] offline::OfflineError),
    /// A `policy` command failed (a refused policy among them).
    #[error(transparent)]
    Policy(#[from] crate::policy::cli::PolicyCliError),
    /// An admin command (`token list|create|revoke`, `node list|revoke`, `key rotate`) failed.
    #[error(transparent)]
    AdminCli(#[from] crate::admin_cli::AdminCliError),
    /// `token create --out FILE` could not write FILE (or it exists and
    /// `--overwrite` was not given: then no token was minted).
    #[error("token create --out: {0}")]
    TokenOut(#[from] agentmesh_runtime::at_rest::AtRestError),
    /// A token was minted but its `--out` file could not be written:
    /// revoke it by its id.
    #[error(
        "token {token_id} was minted but not written to {path}: {source}; revoke it (`token revoke {token_id}`)"
    )]
    TokenNotWritten {
        /// The minted token's id.
        token_id: String,
        /// The `--out` file.
        path: PathBuf,
        /// Why it was not written.
        source: agentmesh_runtime::at_rest::AtRestError,
    },
    /// A blocking task died.
    #[error("task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A long-lived task stopped outside a shutdown (the supervisor's report).
    #[error("{0}; the control plane stopped")]
    TaskStopped(crate::supervisor::TaskFailure),
    /// Signal handlers could not be installed.
    #[error("signals: {0}")]
    Signal(#[from] std::io::Error),
}
use agentmesh_proto::{
    credential::parse_label,
    pb::credential::{Role, TokenKind},
};
use clap::{Parser, Subcommand, ValueEnum};

/// The parsed command line.
#[derive(Parser)]
#[command(
    name = "agentmesh-control-plane",
    version = agentmesh_runtime::cli::VERSION,
    about = "agentmesh control plane",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    serve: Config,
    /// `--log-format`.
    #[command(flatten)]
    pub log: agentmesh_runtime::cli::LogArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve gRPC and HTTP (the default).
    Serve(Box<Config>),
    /// Token operations.
    #[command(subcommand)]
    Token(TokenCmd),
    /// Consistent copy of a SQLite database while serving (VACUUM INTO, read-only).
    Backup {
        /// Database, sqlite://PATH.
        #[arg(long, default_value = DEFAULT_DB)]
        db: String,
        /// New file to write (must not exist).
        #[arg(long)]
        to: PathBuf,
    },
    /// Database operations.
    #[command(subcommand)]
    Store(StoreCmd),
    /// Policy operations: check a file, apply it, show or diff versions.
    #[command(subcommand)]
    Policy(crate::policy::cli::PolicyCmd),
    /// Node operations through the admin API: list, revoke.
    #[command(subcommand)]
    Node(NodeCmd),
    /// Signing-key operations through the admin API.
    #[command(subcommand)]
    Key(KeyCmd),
}

#[derive(Subcommand)]
enum StoreCmd {
    /// Copy every table into an empty database (SQLite to PostgreSQL, or back).
    Copy {
        /// Source database, sqlite://PATH or postgres://…
        #[arg(long)]
        from: String,
        /// Target database, empty or new.
        #[arg(long)]
        to: String,
        /// The source's key-encryption key file. Default: as the server resolves it.
        #[arg(long)]
        from_key_encryption_key_file: Option<PathBuf>,
        /// The target's key-encryption key file. Default: as the server resolves it.
        #[arg(long)]
        key_encryption_key_file: Option<PathBuf>,
    },
    /// Start a new policy epoch: run it on a database restored from a dump (pg_restore), so members take up its policy history.
    NewPolicyEpoch {
        /// Database, sqlite://PATH or postgres://…
        #[arg(long, default_value = DEFAULT_DB)]
        db: String,
    },
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Mint a token and print it once (or write it to --out): in the database (--db), or through the admin API (--admin-token-file).
    Create(Box<CreateArgs>),
    /// List the tokens through the admin API: what each grants, its uses, expiry and revocation (never a secret).
    List {
        #[allow(missing_docs)]
        #[command(flatten)]
        list: crate::admin_cli::ListArgs,
        #[allow(missing_docs)]
        #[command(flatten)]
        admin: crate::policy::cli::AdminArgs,
    },
    /// Revoke a token through the admin API: it enrolls no one again and every member enrolled with it is refused.
    Revoke {
        /// The token's id (printed by `token create`; not the secret).
        token_id: String,
        /// Why, recorded with the revocation and published with it (default: none).
        #[arg(long, default_value = "")]
        reason: String,
        /// The request id, to retry an earlier invocation that got no answer and get its answer (default: a new one, printed).
        #[arg(long)]
        request_id: Option<String>,
        #[allow(missing_docs)]
        #[command(flatten)]
        admin: crate::policy::cli::AdminArgs,
    },
}

/// `token create`.
#[derive(clap::Args)]
struct CreateArgs {
    /// Database, sqlite://PATH or postgres://…
    #[arg(long, default_value = DEFAULT_DB)]
    db: String,
    /// Bootstrap (reusable up to --max-uses) or ephemeral (its members are deleted once they stop refreshing).
    #[arg(long, value_enum)]
    kind: Kind,
    /// Role of the members enrolling with it.
    #[arg(long, value_enum)]
    role: RoleArg,
    /// Label key=value members of this token get, repeatable (default: none).
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Enrollments the token allows, enrollments.
    #[arg(long, default_value_t = 1)]
    max_uses: u32,
    /// Token lifetime, seconds.
    #[arg(long, default_value_t = 86_400)]
    ttl_secs: u64,
    /// Write the token to this file (mode 0600, a new file unless --overwrite) instead of stdout (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
    /// With --out, replace an existing file (default: refuse, before minting).
    #[arg(long, requires = "out")]
    overwrite: bool,
    /// Mint through the admin API of a running control plane, with the admin token in this file, instead of writing --db (default: none, write --db).
    #[arg(long, conflicts_with = "db")]
    admin_token_file: Option<PathBuf>,
    /// With --admin-token-file: control-plane gRPC URL, http:// or https:// (default http://127.0.0.1:7400).
    #[arg(long, default_value = crate::client::DEFAULT_URL, requires = "admin_token_file")]
    control_plane: String,
    /// With --admin-token-file: PEM file of the CA that signs an https:// control plane's certificate (default: none).
    #[arg(long, requires = "admin_token_file")]
    control_plane_ca: Option<PathBuf>,
    /// With --admin-token-file: time bound on the call with its retries, seconds.
    #[arg(long, default_value_t = crate::policy::cli::DEFAULT_TIMEOUT_SECS, requires = "admin_token_file")]
    timeout_secs: u64,
    /// With --admin-token-file: the request id, to retry an earlier invocation that got no answer without minting twice (default: a new one, printed).
    #[arg(long, requires = "admin_token_file")]
    request_id: Option<String>,
}

#[derive(Subcommand)]
enum NodeCmd {
    /// List the enrolled nodes through the admin API: PeerId, labels and groups, enrollment, last refresh, revocation.
    List {
        #[allow(missing_docs)]
        #[command(flatten)]
        list: crate::admin_cli::ListArgs,
        #[allow(missing_docs)]
        #[command(flatten)]
        admin: crate::policy::cli::AdminArgs,
    },
    /// Revoke a node through the admin API: its refreshes, leases and admissions are refused until its last credential expires.
    Revoke {
        /// The node's PeerId (the PEER_ID column of `node list`).
        peer_id: String,
        /// Why, recorded with the revocation and published with it (default: none).
        #[arg(long, default_value = "")]
        reason: String,
        /// The request id, to retry an earlier invocation that got no answer and get its answer (default: a new one, printed).
        #[arg(long)]
        request_id: Option<String>,
        #[allow(missing_docs)]
        #[command(flatten)]
        admin: crate::policy::cli::AdminArgs,
    },
}

#[derive(Subcommand)]
enum KeyCmd {
    /// Start a signing-key rotation now through the admin API (the new key is published before it signs).
    Rotate {
        /// The request id, to retry an earlier invocation that got no answer without rotating twice (default: a new one, printed).
        #[arg(long)]
        request_id: Option<String>,
        #[allow(missing_docs)]
        #[command(flatten)]
        admin: crate::policy::cli::AdminArgs,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Kind {
    /// Reusable up to --max-uses.
    Bootstrap,
    /// Its members are deleted once they stop refreshing.
    Ephemeral,
}

#[derive(Clone, Copy, ValueEnum)]
enum RoleArg {
    /// A member node.
    Member,
    /// A router.
    Router,
}

impl Cli {
    /// Runs the command (serving until SIGINT/SIGTERM).
    pub async fn run(self) -> Result<(), CliError> {
        let cli = self;
        match cli.cmd {
            None => serve(cli.serve).await,
            Some(Cmd::Serve(c)) => serve(*c).await,
            Some(Cmd::Token(TokenCmd::Create(args))) => create_token(*args).await,
            Some(Cmd::Token(TokenCmd::List { list, admin })) => {
                Ok(crate::admin_cli::token_list(list, &admin).await?)
            }
            Some(Cmd::Node(NodeCmd::List { list, admin })) => {
                Ok(crate::admin_cli::node_list(list, &admin).await?)
            }
            Some(Cmd::Node(NodeCmd::Revoke {
                peer_id,
                reason,
                request_id,
                admin,
            })) => Ok(crate::admin_cli::node_revoke(&peer_id, &reason, request_id, &admin).await?),
            Some(Cmd::Key(KeyCmd::Rotate { request_id, admin })) => {
                Ok(crate::admin_cli::key_rotate(request_id, &admin).await?)
            }
            Some(Cmd::Token(TokenCmd::Revoke {
                token_id,
                reason,
                request_id,
                admin,
            })) => {
                Ok(crate::admin_cli::token_revoke(&token_id, &reason, request_id, &admin).await?)
            }
            Some(Cmd::Backup { db, to }) => {
                let shown = to.display().to_string();
                offline::backup(&db, &to).await?;
                eprintln!("backup written to {shown}");
                Ok(())
            }
            Some(Cmd::Store(StoreCmd::Copy {
                from,
                to,
                from_key_encryption_key_file,
                key_encryption_key_file,
            })) => {
                let spec = offline::CopySpec {
                    from,
                    to,
                    from_kek_file: from_key_encryption_key_file,
                    to_kek_file: key_encryption_key_file,
                };
                for (table, rows) in offline::copy(&spec).await? {
                    eprintln!("copied {rows} rows of {table}");
                }
                Ok(())
            }
            Some(Cmd::Store(StoreCmd::NewPolicyEpoch { db })) => {
                let epoch = offline::new_policy_epoch(&db).await?;
                eprintln!(
                    "new policy epoch {}; restart the control planes on this database",
                    crate::policy::epoch_hex(epoch)
                );
                Ok(())
            }
            Some(Cmd::Policy(cmd)) => Ok(cmd.run().await?),
        }
    }
}

/// `token create`: mints in the database (`--db`) or through the admin API
/// (`--admin-token-file`), then prints the token once or writes `--out`.
async fn create_token(a: CreateArgs) -> Result<(), CliError> {
    // Refused before anything is minted: no token is lost.
    if let Some(path) = a.out.as_ref().filter(|p| !a.overwrite && p.exists()) {
        return Err(agentmesh_runtime::at_rest::AtRestError::Exists(path.clone()).into());
    }
    let kind = match a.kind {
        Kind::Bootstrap => TokenKind::Bootstrap,
        Kind::Ephemeral => TokenKind::Ephemeral,
    };
    let role = match a.role {
        RoleArg::Member => Role::Member,
        RoleArg::Router => Role::Router,
    };
    let t = match a.admin_token_file {
        None => {
            let spec = TokenSpec {
                kind,
                role,
                labels: a.labels.into_iter().collect::<BTreeMap<_, _>>(),
                max_uses: a.max_uses,
                ttl_secs: a.ttl_secs,
            };
            offline::create_token(&a.db, spec).await?
        }
        Some(admin_token_file) => {
            let admin = crate::policy::cli::AdminArgs {
                control_plane: a.control_plane,
                control_plane_ca: a.control_plane_ca,
                admin_token_file,
                timeout_secs: a.timeout_secs,
            };
            let req = agentmesh_proto::pb::controlplane::CreateTokenRequest {
                kind: kind as i32,
                role: role as i32,
                labels: a
                    .labels
                    .into_iter()
                    .map(|(key, value)| agentmesh_proto::pb::credential::Label { key, value })
                    .collect(),
                max_uses: a.max_uses,
                ttl_secs: a.ttl_secs,
            };
            let m = crate::admin_cli::token_create(req, a.request_id, &admin).await?;
            offline::MintedToken {
                token: m.token,
                token_id: m.token_id,
                expires_at: m.expires_at,
            }
        }
    };
    let Some(path) = a.out else {
        eprintln!(
            "token {} expires at {} (shown once; only its SHA-256 is stored)",
            t.token_id, t.expires_at
        );
        println!("{}", t.token);
        return Ok(());
    };
    let (p, line) = (path.clone(), format!("{}\n", t.token));
    let overwrite = a.overwrite;
    tokio::task::spawn_blocking(move || {
        agentmesh_runtime::at_rest::create_private(&p, line.as_bytes(), overwrite)
    })
    .await?
    .map_err(|source| CliError::TokenNotWritten {
        token_id: t.token_id.clone(),
        path: path.clone(),
        source,
    })?;
    eprintln!(
        "token {} expires at {}: written to {} (mode 0600; only its SHA-256 is stored)",
        t.token_id,
        t.expires_at,
        path.display()
    );
    Ok(())
}

async fn serve(config: Config) -> Result<(), CliError> {
    let mut registry = Registry::default();
    let stalls = watchdog::StallMetrics::register(&mut registry);
    // The binary's allocator is jemalloc: `agentmesh_runtime_allocator_*`.
    agentmesh_runtime::allocator::register(&mut registry);
    let probe = watchdog::spawn(stalls);
    // Handlers first: a SIGTERM that arrives as soon as the address is
    // logged (a supervisor or a test stopping it at once) must still end
    // in a graceful shutdown, not the signal's default action.
    let mut stop = agentmesh_runtime::signals::StopSignals::install()?;
    let handle = spawn_with(config, TokioClock::shared(), registry).await?;
    // A task that stops outside a shutdown leaves a half-dead process:
    // stop with its name and a non-zero status.
    let failed = tokio::select! {
        _ = stop.recv() => None,
        f = handle.failed() => Some(f),
    };
    tracing::info!("shutting down");
    handle.shutdown().await;
    probe.abort();
    match failed {
        Some(f) => Err(CliError::TaskStopped(f)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn every_flag_has_a_one_line_help_with_unit_and_default() {
        let problems = agentmesh_runtime::cli::help_problems(&Cli::command());
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn every_flag_is_in_the_readme() {
        let missing = agentmesh_runtime::cli::flags_missing_from(
            &Cli::command(),
            include_str!("../README.md"),
        );
        assert!(missing.is_empty(), "not in the README: {missing:?}");
    }

    #[test]
    fn the_version_names_the_commit() {
        assert_eq!(
            Cli::command().get_version(),
            Some(agentmesh_runtime::cli::VERSION)
        );
    }

    #[test]
    fn no_flags_serves_with_the_default_config() {
        let cli = Cli::try_parse_from(["agentmesh-control-plane"]).expect("parses");
        assert!(cli.cmd.is_none());
        assert_eq!(cli.serve, Config::default());
        let cli = Cli::try_parse_from(["agentmesh-control-plane", "serve"]).expect("parses");
        assert!(matches!(cli.cmd, Some(Cmd::Serve(c)) if *c == Config::default()));
        let cli = Cli::try_parse_from([
            "x",
            "token",
            "create",
            "--kind",
            "bootstrap",
            "--role",
            "router",
            "--label",
            "zone=a",
        ])
        .expect("parses");
        assert!(
            matches!(cli.cmd, Some(Cmd::Token(TokenCmd::Create(a))) if a.labels == vec![("zone".into(), "a".into())] && a.admin_token_file.is_none())
        );
    }
}
