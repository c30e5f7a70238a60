//! `agentmesh-control-plane policy check|apply|show|diff`.
//!
//! `check` needs no server: it runs the very checks an apply runs (syntax,
//! names, rules against each other, the document's tests) and exits 1
//! with every problem as `FILE:LINE:COLUMN: message`. The others talk to a
//! running control plane over gRPC with the admin token; `apply` checks
//! locally first, so a bad file is refused before anything is sent, and
//! the control plane checks it again (its verdict is the one that counts).
//! `show` writes the policy's exact text to stdout and what it is to
//! stderr, so `policy show > current.toml` round-trips.

use std::{path::PathBuf, time::Duration};

use agentmesh_policy::{Policy, Summary};
use agentmesh_proto::pb::controlplane::{ApplyPolicyRequest, GetPolicyResponse, PolicySummary};

use super::{diff::unified, epoch_hex, problems_at};
use crate::client::{Client, ClientConfig, ClientError, DEFAULT_URL};

/// Default `--timeout-secs` of the admin commands.
pub const DEFAULT_TIMEOUT_SECS: u64 = 30;

/// `policy …` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum PolicyCmd {
    /// Check a policy file (syntax, group names, rules, its tests) without a server; exit status 1 when it is refused.
    Check {
        /// The policy file (TOML).
        file: PathBuf,
    },
    /// Apply a policy file through the admin API: the next version, unless it is the text in force.
    Apply {
        /// The policy file (TOML).
        file: PathBuf,
        /// Who applies it, recorded with the version (default: $USER).
        #[arg(long)]
        author: Option<String>,
        /// The request id, to retry an earlier invocation that got no answer without applying twice (default: a new one, printed).
        #[arg(long)]
        request_id: Option<String>,
        #[allow(missing_docs)]
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Print the policy in force or a kept version: its text on stdout, what it is on stderr.
    Show {
        /// The version to print (default: the one in force).
        #[arg(long)]
        version: Option<u64>,
        #[allow(missing_docs)]
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Show what a file would change against the policy in force (without FILE: what the version in force changed).
    Diff {
        /// The policy file to compare (default: none, the version in force is compared with the one before it).
        file: Option<PathBuf>,
        /// Compare from this kept version instead (default: the version in force, or without FILE the one before it).
        #[arg(long)]
        from_version: Option<u64>,
        #[allow(missing_docs)]
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// How the admin commands reach the control plane.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminArgs {
    /// Control-plane gRPC URL, http:// or https:// (default http://127.0.0.1:7400).
    #[arg(long, default_value = DEFAULT_URL)]
    pub control_plane: String,
    /// PEM file of the CA that signs an https:// control plane's certificate (default: none).
    #[arg(long)]
    pub control_plane_ca: Option<PathBuf>,
    /// File holding the admin bearer token, the one the control plane was started with.
    #[arg(long)]
    pub admin_token_file: PathBuf,
    /// Time bound on the call with its retries, seconds.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_SECS)]
    pub timeout_secs: u64,
}

/// Why a `policy` command failed.
#[derive(Debug, thiserror::Error)]
pub enum PolicyCliError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The policy did not pass its checks (locally, or at the control plane).
    #[error("the policy is refused; nothing was applied:\n{0}")]
    Refused(String),
    /// The control plane refused or could not be reached.
    #[error("{0}")]
    Client(String),
}

fn read(path: &std::path::Path) -> Result<String, PolicyCliError> {
    std::fs::read_to_string(path).map_err(|source| PolicyCliError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn check_text(path: &std::path::Path, text: &str) -> Result<Summary, PolicyCliError> {
    Policy::parse(text)
        .map(|p| p.summary())
        .map_err(|e| PolicyCliError::Refused(problems_at(&path.display().to_string(), &e)))
}

fn describe(s: &Summary) -> String {
    format!(
        "{} group(s), {} owner rule(s), {} grant(s), {} test(s) passed",
        s.groups, s.owners, s.grants, s.tests
    )
}

fn describe_pb(s: Option<&PolicySummary>) -> String {
    s.map_or_else(
        || "not readable by this binary".to_string(),
        |s| {
            describe(&Summary {
                groups: s.groups as usize,
                owners: s.owners as usize,
                grants: s.grants as usize,
                tests: s.tests as usize,
            })
        },
    )
}

impl AdminArgs {
    /// A client for the control plane and the admin token read from its file.
    pub fn connect(&self) -> Result<(Client, String), PolicyCliError> {
        let token = read(&self.admin_token_file)?.trim().to_string();
        let ca_pem = match &self.control_plane_ca {
            Some(p) => Some(std::fs::read(p).map_err(|source| PolicyCliError::Read {
                path: p.display().to_string(),
                source,
            })?),
            None => None,
        };
        let secs = self.timeout_secs.max(1);
        let client = Client::new(ClientConfig {
            url: self.control_plane.clone(),
            ca_pem,
            retry_budget: Duration::from_secs(secs),
            rpc_timeout: Duration::from_secs(secs.min(10)),
        })
        .map_err(|e| PolicyCliError::Client(e.to_string()))?;
        Ok((client, token))
    }
}

/// A refusal as an operator should read it.
fn client_error(e: ClientError, bytes: usize) -> PolicyCliError {
    match e.status() {
        Some(s) if s.code() == tonic::Code::InvalidArgument => {
            PolicyCliError::Refused(s.message().to_string())
        }
        Some(s) if s.code() == tonic::Code::OutOfRange => PolicyCliError::Client(format!(
            "the control plane refused a {bytes}-byte request as too large: it takes gRPC \
             requests up to its --grpc-max-message-bytes (default 65536). Raise that flag, or \
             apply the file at start with --policy FILE ({})",
            s.message()
        )),
        Some(s) => PolicyCliError::Client(format!("{:?}: {}", s.code(), s.message())),
        None => PolicyCliError::Client(e.to_string()),
    }
}

fn header(p: &GetPolicyResponse) -> String {
    if p.version == 0 {
        return format!(
            "# no policy applied (epoch {}): every call is denied\n",
            epoch_hex(p.epoch)
        );
    }
    let state = if p.version == p.current_version {
        "in force".to_string()
    } else {
        format!(
            "replaced at unix {}; version {} is in force",
            p.replaced_at_unix_secs, p.current_version
        )
    };
    format!(
        "# policy version {} ({state}), epoch {}\n# applied at unix {} by {} from {}\n# {}\n",
        p.version,
        epoch_hex(p.epoch),
        p.applied_at_unix_secs,
        p.applied_by,
        p.applied_from,
        describe_pb(p.summary.as_ref()),
    )
}

impl PolicyCmd {
    /// Runs the command, printing as it goes.
    pub async fn run(self) -> Result<(), PolicyCliError> {
        match self {
            PolicyCmd::Check { file } => {
                let text = read(&file)?;
                let s = check_text(&file, &text)?;
                println!("{}: ok: {}", file.display(), describe(&s));
                Ok(())
            }
            PolicyCmd::Apply {
                file,
                author,
                request_id,
                admin,
            } => {
                let text = read(&file)?;
                check_text(&file, &text)?;
                let (client, token) = admin.connect()?;
                let author = author
                    .or_else(|| std::env::var("USER").ok())
                    .unwrap_or_default();
                let bytes = text.len();
                let id = request_id.unwrap_or_else(|| crate::client::new_request_id("cli"));
                eprintln!("request id {id} (give it as --request-id to retry this apply)");
                let req = ApplyPolicyRequest {
                    text,
                    dry_run: false,
                    author,
                };
                let r = client
                    .apply_policy_once(&token, req, &id)
                    .await
                    .map_err(|e| client_error(e, bytes))?;
                if r.applied {
                    println!(
                        "applied {} as policy version {} (epoch {}): {}",
                        file.display(),
                        r.version,
                        epoch_hex(r.epoch),
                        describe_pb(r.summary.as_ref())
                    );
                } else {
                    println!(
                        "unchanged: {} is the text of policy version {}, in force",
                        file.display(),
                        r.version
                    );
                }
                Ok(())
            }
            PolicyCmd::Show { version, admin } => {
                let (client, token) = admin.connect()?;
                let p = client
                    .get_policy(&token, version.unwrap_or(0))
                    .await
                    .map_err(|e| client_error(e, 0))?;
                eprint!("{}", header(&p));
                print!("{}", p.text);
                Ok(())
            }
            PolicyCmd::Diff {
                file,
                from_version,
                admin,
            } => {
                let (client, token) = admin.connect()?;
                let get = |v: u64| {
                    let (client, token) = (client.clone(), token.clone());
                    async move {
                        client
                            .get_policy(&token, v)
                            .await
                            .map_err(|e| client_error(e, 0))
                    }
                };
                let (old_name, old, new_name, new) = match file {
                    Some(path) => {
                        let text = read(&path)?;
                        let base = get(from_version.unwrap_or(0)).await?;
                        (
                            format!("version {}", base.version),
                            base.text,
                            path.display().to_string(),
                            text,
                        )
                    }
                    None => {
                        let current = get(0).await?;
                        let from = from_version.unwrap_or(current.version.saturating_sub(1));
                        let (old_name, old) = if from == 0 {
                            ("none applied".to_string(), String::new())
                        } else {
                            (format!("version {from}"), get(from).await?.text)
                        };
                        (
                            old_name,
                            old,
                            format!("version {}", current.version),
                            current.text,
                        )
                    }
                };
                let d = unified(&old_name, &new_name, &old, &new, 3);
                if d.is_empty() {
                    eprintln!("no differences between {old_name} and {new_name}");
                } else {
                    print!("{d}");
                }
                Ok(())
            }
        }
    }
}
