//! Finding the programs the ladder starts: next to the ladder's own executable,
//! so the profile that was built (test profile in CI, release from
//! `member-ladder.sh`) is the one that runs.

use std::path::{Path, PathBuf};

use crate::error::{LadderError, Result};

/// The control plane binary's name.
pub const CONTROL_PLANE: &str = "agentmesh-control-plane";
/// The router binary's name.
pub const ROUTER: &str = "agentmesh-router";
/// The hostile-peer harness's name (needed only by `--attack-*`).
pub const HOSTILE: &str = "agentmesh-hostile";

/// Paths of the programs a local ladder starts.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The ladder itself (re-executed as `worker`).
    pub ladder: PathBuf,
    /// `agentmesh-control-plane`.
    pub control_plane: PathBuf,
    /// `agentmesh-router`.
    pub router: PathBuf,
}

impl Binaries {
    /// Locates the programs beside the running executable.
    pub fn locate() -> Result<Self> {
        let ladder = std::env::current_exe()
            .map_err(|e| LadderError::io("locating the ladder's own executable", e))?;
        Self::beside(&ladder)
    }

    /// Locates the programs in the directory of `ladder`.
    pub fn beside(ladder: &Path) -> Result<Self> {
        let dir = programs_dir(ladder)?;
        Ok(Self {
            ladder: ladder.to_path_buf(),
            control_plane: find(dir, CONTROL_PLANE, "agentmesh-controlplane")?,
            router: find(dir, ROUTER, "agentmesh-router")?,
        })
    }
}

impl Binaries {
    /// `agentmesh-hostile` beside the ladder: looked for only when an
    /// attack is asked for, so other runs need not build it.
    pub fn hostile(&self) -> Result<PathBuf> {
        find(programs_dir(&self.ladder)?, HOSTILE, "agentmesh-hostile")
    }
}

/// The directory the programs are in: the ladder's own, or its parent for
/// a test binary (those live in target/<profile>/deps, the programs in
/// target/<profile>).
fn programs_dir(ladder: &Path) -> Result<&Path> {
    let dir = ladder.parent().ok_or_else(|| {
        LadderError::Args(format!("{} has no parent directory", ladder.display()))
    })?;
    Ok(if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    })
}

/// `dir/name` if it exists, else an error naming the cargo command that builds it.
pub fn find(dir: &Path, name: &str, package: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    if path.is_file() {
        return Ok(path);
    }
    let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug");
    let build = match profile {
        "release" => format!("cargo build --release -p {package}"),
        "debug" => format!("cargo build -p {package}"),
        other => format!("cargo build --profile {other} -p {package}"),
    };
    Err(LadderError::MissingBinary {
        name: name.to_string(),
        path,
        build,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_names_the_build_command() {
        let dir = tempfile::tempdir().expect("tempdir");
        let release = dir.path().join("release");
        std::fs::create_dir_all(&release).expect("mkdir");
        let err = find(&release, ROUTER, "agentmesh-router").expect_err("missing");
        assert!(
            err.to_string()
                .contains("cargo build --release -p agentmesh-router"),
            "{err}"
        );
        std::fs::write(release.join(ROUTER), b"").expect("touch");
        assert!(find(&release, ROUTER, "agentmesh-router").is_ok());
    }

    #[test]
    fn the_harness_is_looked_for_beside_the_programs_only_when_asked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let release = dir.path().join("release");
        std::fs::create_dir_all(release.join("deps")).expect("mkdir");
        for name in [CONTROL_PLANE, ROUTER] {
            std::fs::write(release.join(name), b"").expect("touch");
        }
        // A test binary in deps/ finds the programs one level up.
        let bins = Binaries::beside(&release.join("deps").join("ladder-test")).expect("programs");
        let err = bins.hostile().expect_err("not built");
        assert!(
            err.to_string()
                .contains("cargo build --release -p agentmesh-hostile"),
            "{err}"
        );
        std::fs::write(release.join(HOSTILE), b"").expect("touch");
        assert_eq!(bins.hostile().expect("found"), release.join(HOSTILE));
    }
}
