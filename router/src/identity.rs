//! The router's persistent ed25519 identity: a protobuf-encoded libp2p
//! keypair in a file of mode 0600, created on first run.

use std::io::Write;
use std::path::{Path, PathBuf};

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
    /// The file exists but does not hold a keypair.
    #[error("key file {path} does not hold a libp2p keypair")]
    Malformed {
        /// The key file.
        path: PathBuf,
    },
}

/// Loads the keypair at `path`, or creates one there (blocking I/O: call it
/// from `spawn_blocking`).
pub fn load_or_create(path: &Path) -> Result<Keypair, IdentityError> {
    let io = |source| IdentityError::Io {
        path: path.to_path_buf(),
        source,
    };
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
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(io)?;
            }
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                opts.mode(0o600);
            }
            let mut f = opts.open(path).map_err(io)?;
            f.write_all(&bytes).map_err(io)?;
            f.sync_all().map_err(io)?;
            Ok(key)
        }
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_created_once_with_mode_0600_and_reloaded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub").join("router.key");
        let a = load_or_create(&path).expect("create");
        let b = load_or_create(&path).expect("load");
        assert_eq!(a.public().to_peer_id(), b.public().to_peer_id());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn garbage_key_file_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("router.key");
        std::fs::write(&path, b"not a key").expect("write");
        let err = load_or_create(&path).expect_err("garbage");
        assert!(matches!(err, IdentityError::Malformed { .. }), "{err}");
    }
}
