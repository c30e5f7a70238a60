//! A reused `--work-dir` starts like a fresh one: what an earlier run left
//! there would leak into this run's numbers. The control plane's database
//! would add its members, tokens and keys to this run's storage rows; the
//! members' data directories would hand this run's members the old run's
//! credentials, signed by a key the new control plane no longer has (each
//! is refused before the member enrolls again); and the logs, opened for
//! appending so a restarted router keeps its first life, would mix in the
//! old run's lines. Router keys stay: a router's identity may outlive a run.

use std::path::Path;

use crate::error::{LadderError, Result};

/// `prefix` followed by a decimal number only (`r0`, `w12`, `round3`).
fn numbered(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether the entry `name` of a work directory belongs to an earlier run.
pub fn is_previous_run_entry(name: &str) -> bool {
    let log_of = |stem: &str| {
        numbered(stem, "r") || numbered(stem, "worker-") || numbered(stem, "control-plane-")
    };
    name.strip_suffix(".log")
        .is_some_and(|stem| log_of(stem) || stem == "control-plane" || stem == "postgres")
        || numbered(name, "w")
        || numbered(name, "round")
        || matches!(
            name,
            "control-plane.db"
                | "control-plane.db-wal"
                | "control-plane.db-shm"
                | "control-plane.db.kek"
                | "control-plane.kek"
        )
}

/// Removes the entries of `dir` that [`is_previous_run_entry`] names.
pub async fn clear_previous_run(dir: &Path) -> Result<()> {
    let read = |e| LadderError::io(format!("reading {}", dir.display()), e);
    let mut entries = tokio::fs::read_dir(dir).await.map_err(read)?;
    while let Some(entry) = entries.next_entry().await.map_err(read)? {
        if !entry
            .file_name()
            .to_str()
            .is_some_and(is_previous_run_entry)
        {
            continue;
        }
        let path = entry.path();
        let is_dir = entry.file_type().await.map_err(read)?.is_dir();
        let removed = if is_dir {
            tokio::fs::remove_dir_all(&path).await
        } else {
            tokio::fs::remove_file(&path).await
        };
        removed.map_err(|e| LadderError::io(format!("removing {}", path.display()), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_earlier_runs_database_logs_and_member_dirs_are_named() {
        for name in [
            "r0.log",
            "r12.log",
            "worker-3.log",
            "control-plane.log",
            "control-plane-2.log",
            "postgres.log",
            "control-plane.db",
            "control-plane.db-wal",
            "control-plane.db-shm",
            "control-plane.db.kek",
            "control-plane.kek",
            "w0",
            "w15",
            "round2",
        ] {
            assert!(is_previous_run_entry(name), "{name}");
        }
        for name in [
            "r0.key",
            "r.log",
            "rx.log",
            "router.token",
            "member.token",
            "admin.token",
            "w",
            "work",
            "round",
            "report.json",
            "control-plane.db.bak",
            "control-plane-x.log",
        ] {
            assert!(!is_previous_run_entry(name), "{name}");
        }
    }

    #[tokio::test]
    async fn a_reused_work_dir_keeps_only_router_keys_and_foreign_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        for name in [
            "r0.log",
            "control-plane.db",
            "control-plane.db-wal",
            "r0.key",
            "notes.txt",
        ] {
            std::fs::write(dir.path().join(name), b"old").expect("write");
        }
        let member = dir.path().join("w0").join("m1");
        std::fs::create_dir_all(&member).expect("mkdir");
        std::fs::write(member.join("credential.pb"), b"old").expect("write");
        clear_previous_run(dir.path()).await.expect("clear");
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["notes.txt", "r0.key"]);
    }
}
