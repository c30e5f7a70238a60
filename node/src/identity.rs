//! The node's persistent identity in its data dir: the ed25519 key
//! (`node.key`), the last credential (`credential.pb`) and the last key set
//! (`keys.pb`), each written atomically with mode 0600.
//!
//! Before anything in it is read, the data dir and these files are checked
//! (`agentmesh_runtime::at_rest`): a dir or file that others may write
//! (group- or world-writable, or another user's) stops the node with an
//! error naming the path and its mode, since a planted `keys.pb` would make
//! it trust forged credentials; a file others may only read is set back to
//! 0600 (and logged).
//!
//! All file I/O here is blocking; callers run it under `spawn_blocking`.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use agentmesh_runtime::at_rest::{self, AtRestError};

use agentmesh_proto::pb::credential::{Credential, KeySet};
use libp2p::identity::Keypair;
use prost::Message;

/// File name of the private key.
pub const KEY_FILE: &str = "node.key";
/// File name of the credential.
pub const CREDENTIAL_FILE: &str = "credential.pb";
/// File name of the control plane's key set.
pub const KEYS_FILE: &str = "keys.pb";

/// Why the identity could not be loaded or stored.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// The data dir or a file in it may be written by others.
    #[error(transparent)]
    AtRest(#[from] AtRestError),
    /// A file exists but does not hold what it should.
    #[error("{path}: {what}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> IdentityError + '_ {
    move |source| IdentityError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What a data dir holds at start-up.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The key (created if it was missing).
    pub key: Keypair,
    /// Whether the key was created just now.
    pub created: bool,
    /// The last credential, if any.
    pub credential: Option<Credential>,
    /// The last key set, if any.
    pub keys: Option<KeySet>,
}

/// Loads the identity from `dir`, creating the dir (0700) and a new key
/// (0600) on first run; refuses a dir or file others may write (see the
/// module doc).
pub fn load_or_create(dir: &Path) -> Result<Stored, IdentityError> {
    create_private_dir(dir)?;
    at_rest::check_private_dir(dir, "data dir")?;
    for (file, what) in [
        (KEY_FILE, "key file"),
        (CREDENTIAL_FILE, "credential file"),
        (KEYS_FILE, "key set file"),
    ] {
        let path = dir.join(file);
        if let Some(mode) = at_rest::check_private_file(&path, what)? {
            tracing::warn!(path = %path.display(), was = format!("{mode:04o}"), "{what} was readable by others: set back to 0600");
        }
    }
    let key_path = dir.join(KEY_FILE);
    let (key, created) = match fs::read(&key_path) {
        Ok(bytes) => {
            let key =
                Keypair::from_protobuf_encoding(&bytes).map_err(|e| IdentityError::Corrupt {
                    path: key_path.clone(),
                    what: format!("not a libp2p key: {e}"),
                })?;
            (key, false)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = Keypair::generate_ed25519();
            let bytes = key
                .to_protobuf_encoding()
                .map_err(|e| IdentityError::Corrupt {
                    path: key_path.clone(),
                    what: format!("key does not encode: {e}"),
                })?;
            write_private(&key_path, &bytes)?;
            (key, true)
        }
        Err(e) => return Err(io_err(&key_path)(e)),
    };
    let credential = read_message::<Credential>(&dir.join(CREDENTIAL_FILE))?;
    let keys = read_message::<KeySet>(&dir.join(KEYS_FILE))?;
    Ok(Stored {
        key,
        created,
        credential,
        keys,
    })
}

/// Stores the credential (0600, atomically).
pub fn store_credential(dir: &Path, credential: &Credential) -> Result<(), IdentityError> {
    write_private(&dir.join(CREDENTIAL_FILE), &credential.encode_to_vec())
}

/// Stores the key set (0600, atomically).
pub fn store_keys(dir: &Path, keys: &KeySet) -> Result<(), IdentityError> {
    write_private(&dir.join(KEYS_FILE), &keys.encode_to_vec())
}

fn read_message<M: Message + Default>(path: &Path) -> Result<Option<M>, IdentityError> {
    match fs::read(path) {
        Ok(bytes) => M::decode(bytes.as_slice())
            .map(Some)
            .map_err(|e| IdentityError::Corrupt {
                path: path.to_path_buf(),
                what: format!("does not decode: {e}"),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(path)(e)),
    }
}

/// Creates `dir` and any missing parents with mode 0700 (only the owner
/// may list the dir or reach the socket in it), not the umask's 0755; an
/// existing dir is left as it is (it may be shared, e.g. a mounted volume).
fn create_private_dir(dir: &Path) -> Result<(), IdentityError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))
}

/// Writes `bytes` to `path` atomically with mode 0600.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), IdentityError> {
    Ok(at_rest::write_private(path, bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn key_survives_a_restart_and_files_are_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = load_or_create(dir.path()).expect("first");
        assert!(first.created);
        assert!(first.credential.is_none());
        let cred = Credential {
            claims: vec![1, 2, 3],
            signature: vec![4],
        };
        store_credential(dir.path(), &cred).expect("store");
        let again = load_or_create(dir.path()).expect("again");
        assert!(!again.created);
        assert_eq!(
            again.key.public().to_peer_id(),
            first.key.public().to_peer_id()
        );
        assert_eq!(again.credential, Some(cred));
        for f in [KEY_FILE, CREDENTIAL_FILE] {
            let mode = fs::metadata(dir.path().join(f))
                .expect("meta")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
    }

    #[test]
    fn the_data_dir_and_its_missing_parents_are_created_0700() {
        let root = tempfile::tempdir().expect("tempdir");
        let parent = root.path().join("state");
        let dir = parent.join("node");
        load_or_create(&dir).expect("create");
        for d in [&parent, &dir] {
            let mode = fs::metadata(d).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", d.display());
        }
        // An existing dir keeps its mode.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o750)).expect("chmod");
        load_or_create(&dir).expect("again");
        let mode = fs::metadata(&dir).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o750);
    }

    #[test]
    fn a_loosened_key_is_set_back_to_0600() {
        let dir = tempfile::tempdir().expect("tempdir");
        load_or_create(dir.path()).expect("first");
        let key = dir.path().join(KEY_FILE);
        fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).expect("chmod");
        load_or_create(dir.path()).expect("again");
        let mode = fs::metadata(&key).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_data_dir_or_key_set_others_may_write_is_refused_naming_path_and_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        load_or_create(dir.path()).expect("first");
        store_keys(dir.path(), &KeySet::default()).expect("keys");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).expect("chmod");
        let err = load_or_create(dir.path()).expect_err("world-writable dir");
        let text = err.to_string();
        assert!(
            text.contains(&dir.path().display().to_string()) && text.contains("0777"),
            "{text}"
        );
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
        let keys = dir.path().join(KEYS_FILE);
        fs::set_permissions(&keys, fs::Permissions::from_mode(0o666)).expect("chmod");
        let err = load_or_create(dir.path()).expect_err("world-writable keys.pb");
        let text = err.to_string();
        assert!(text.contains(KEYS_FILE) && text.contains("0666"), "{text}");
    }

    #[test]
    fn a_corrupt_key_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join(KEY_FILE), b"garbage").expect("write");
        let err = load_or_create(dir.path()).expect_err("corrupt");
        assert!(err.to_string().contains(KEY_FILE), "{err}");
    }
}
