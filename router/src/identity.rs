//! The router's persistent ed25519 identity: a protobuf-encoded libp2p
//! keypair in a file of mode 0600, created on first run.
//!
//! Before the key is read, its dir and the file are checked
//! (`agentmesh_runtime::at_rest`, as the node checks its data dir): a dir
//! or key file that others may write (group- or world-writable, or another
//! user's) stops the router with an error naming the path and its mode (a
//! planted key would make it someone else's identity); a key others may
//! only read is set back to 0600, and the router says so.

use std::path::{Path, PathBuf};

use agentmesh_runtime::at_rest::{self, AtRestError};
use libp2p::identity::Keypair;

/// Why the identity could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// Reading or writing the key file failed.
    #[error("key file {path}: {source}")]
    Io {
        /// The key file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The key file or its dir may be written by others, or writing it failed.
    #[error(transparent)]
    AtRest(#[from] AtRestError),
    /// The file exists but does not hold a keypair.
    #[error("key file {path} does not hold a libp2p keypair")]
    Malformed {
        /// The key file.
        path: PathBuf,
    },
}

/// Loads the keypair at `path`, or creates one there (blocking I/O: call it
/// from `spawn_blocking`); refuses a key or dir others may write (see the
/// module doc).
pub fn load_or_create(path: &Path) -> Result<Keypair, IdentityError> {
    let io = |source| IdentityError::Io {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if dir.exists() {
        at_rest::check_private_dir(dir, "key file's dir")?;
    }
    if let Some(mode) = at_rest::check_private_file(path, "key file")? {
        tracing::warn!(path = %path.display(), was = format!("{mode:04o}"), "key file was readable by others: set back to 0600");
    }
    match std::fs::read(path) {
        Ok(bytes) => {
            Keypair::from_protobuf_encoding(&bytes).map_err(|_| IdentityError::Malformed {
                path: path.to_path_buf(),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = Keypair::generate_ed25519();
            let bytes = key
                .to_protobuf_encoding()
                .map_err(|_| IdentityError::Malformed {
                    path: path.to_path_buf(),
                })?;
            // A new file only: never over one that appeared meanwhile.
            at_rest::create_private(path, &bytes, false)?;
            Ok(key)
        }
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).expect("meta").permissions().mode() & 0o777
    }

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn key_is_created_once_with_mode_0600_and_reloaded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub").join("router.key");
        let a = load_or_create(&path).expect("create");
        let b = load_or_create(&path).expect("load");
        assert_eq!(a.public().to_peer_id(), b.public().to_peer_id());
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&dir.path().join("sub")), 0o700);
    }

    #[test]
    fn a_loosened_key_is_set_back_to_0600() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("router.key");
        let a = load_or_create(&path).expect("create");
        chmod(&path, 0o644);
        let b = load_or_create(&path).expect("load");
        assert_eq!(a.public().to_peer_id(), b.public().to_peer_id());
        assert_eq!(mode(&path), 0o600);
    }

    #[test]
    fn a_key_or_dir_others_may_write_is_refused_naming_path_and_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("router.key");
        load_or_create(&path).expect("create");
        chmod(&path, 0o666);
        let err = load_or_create(&path).expect_err("world-writable key");
        let text = err.to_string();
        assert!(
            text.contains("router.key") && text.contains("0666"),
            "{text}"
        );
        chmod(&path, 0o600);
        chmod(dir.path(), 0o777);
        let err = load_or_create(&path).expect_err("world-writable dir");
        let text = err.to_string();
        assert!(
            text.contains(&dir.path().display().to_string()) && text.contains("0777"),
            "{text}"
        );
    }

    #[test]
    fn garbage_key_file_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("router.key");
        std::fs::write(&path, b"not a key").expect("write");
        chmod(&path, 0o600);
        let err = load_or_create(&path).expect_err("garbage");
        assert!(matches!(err, IdentityError::Malformed { .. }), "{err}");
    }
}
