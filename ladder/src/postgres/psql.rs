//! Reading rows from the control plane's PostgreSQL database with `psql`,
//! so the ladder watches the database (connections in use, signing keys)
//! without linking a PostgreSQL client of its own.
//!
//! `psql` runs as the ladder's user over TCP with the URL and password the
//! control plane has (a password in the environment, never on the command
//! line), `-X` (no `~/.psqlrc`), unaligned and tuples only, each query
//! within [`QUERY_TIMEOUT`].

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use crate::error::{LadderError, Result};

/// Deadline of one query (connect included).
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// A way to run queries against one database.
#[derive(Debug, Clone)]
pub struct Psql {
    bin: PathBuf,
    url: String,
    env: Vec<(String, String)>,
}

impl Psql {
    /// `psql` from `bin_dir` (else the default PostgreSQL binaries, else
    /// `PATH`) against `url`, with `env` (`PGPASSWORD`) added.
    pub fn new(bin_dir: Option<&Path>, url: &str, env: &[(String, String)]) -> Self {
        let bin = bin_dir
            .map(Path::to_path_buf)
            .or_else(super::default_bin_dir)
            .map(|d| d.join("psql"))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("psql"));
        Self {
            bin,
            url: url.to_string(),
            env: env.to_vec(),
        }
    }

    /// The rows of `sql` (one statement), each a list of its columns.
    pub async fn query(&self, sql: &str) -> Result<Vec<Vec<String>>> {
        let mut cmd = Command::new(&self.bin);
        cmd.args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-F",
            "\t",
            "-d",
        ])
        .arg(&self.url)
        .arg("-c")
        .arg(sql)
        .envs(self.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .kill_on_drop(true);
        let out = tokio::time::timeout(QUERY_TIMEOUT, cmd.output())
            .await
            .map_err(|_| {
                LadderError::Process(format!("psql did not answer within {QUERY_TIMEOUT:?}"))
            })?
            .map_err(|e| LadderError::io(format!("running {}", self.bin.display()), e))?;
        if !out.status.success() {
            return Err(LadderError::Process(format!(
                "psql failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(parse_rows(&String::from_utf8_lossy(&out.stdout)))
    }

    /// The first row of `sql` as numbers (a column that is not one: None).
    pub async fn numbers(&self, sql: &str) -> Result<Vec<Option<i64>>> {
        let rows = self.query(sql).await?;
        let row = rows
            .into_iter()
            .next()
            .ok_or_else(|| LadderError::Process(format!("no row from {sql}")))?;
        Ok(row.iter().map(|c| c.trim().parse().ok()).collect())
    }
}

/// `psql -A -t -F '\t'` output as rows of columns.
fn parse_rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_split_on_tabs_and_blank_lines_dropped() {
        assert_eq!(
            parse_rows("3\t100\n\n7\t\n"),
            vec![
                vec!["3".to_string(), "100".into()],
                vec!["7".into(), "".into()]
            ]
        );
        assert!(parse_rows("").is_empty());
    }
}
