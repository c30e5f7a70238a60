//! Signing keys sealed at rest with a key-encryption key (KEK), so a dump or
//! backup of the database alone does not hold the mesh's signing keys.
//!
//! AES-256-GCM (ring). A sealed secret is `MAGIC || kek id (8) || nonce (12)
//! || ciphertext || tag`; the nonce is random per row and the signing key's
//! id is the associated data, so a sealed secret moved to another row does
//! not open. The kek id (the first 8 bytes of the KEK's SHA-256) says which
//! KEK sealed a row: after a KEK rotation the store opens rows sealed with
//! the previous one and seals them again with the current one when it opens.
//!
//! Where the KEK comes from: `--key-encryption-key-file` or the
//! [`KEK_ENV`] variable (64 hex digits, 32 bytes), or, for SQLite only and
//! when neither is given, a file created beside the database
//! (`<db>.kek`, mode 0600).

use std::{path::Path, sync::Arc};

use ring::{
    aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey},
    rand::{SecureRandom, SystemRandom},
};
use sha2::{Digest, Sha256};

use super::StoreError;

/// The environment variable holding the KEK (64 hex digits).
pub const KEK_ENV: &str = "AGENTMESH_KEY_ENCRYPTION_KEY";

/// Leads every sealed secret (format version 1).
const MAGIC: &[u8; 4] = b"amk1";
const ID_LEN: usize = 8;
const HEADER: usize = MAGIC.len() + ID_LEN + NONCE_LEN;

struct Key {
    id: [u8; ID_LEN],
    aead: LessSafeKey,
}

impl Key {
    fn new(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() != 32 {
            return Err(format!(
                "a key-encryption key is 32 bytes (64 hex digits), not {}",
                bytes.len()
            ));
        }
        let digest = Sha256::digest(bytes);
        let mut id = [0; ID_LEN];
        id.copy_from_slice(&digest[..ID_LEN]);
        let unbound = UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| "bad key".to_string())?;
        Ok(Self {
            id,
            aead: LessSafeKey::new(unbound),
        })
    }
}

/// The key-encryption key, and the previous one during a rotation; or
/// none, for offline commands that never touch signing keys (`token
/// create`): then sealing and opening keys fail, and nothing is resealed.
#[derive(Clone)]
pub struct Kek {
    current: Option<Arc<Key>>,
    previous: Option<Arc<Key>>,
}

impl std::fmt::Debug for Kek {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kek")
            .field("id", &self.current.as_ref().map(|k| hex::encode(k.id)))
            .finish_non_exhaustive()
    }
}

impl Kek {
    /// A KEK from its 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        Ok(Self {
            current: Some(Arc::new(Key::new(bytes)?)),
            previous: None,
        })
    }

    /// No KEK: for commands that never read or write signing keys.
    pub fn absent() -> Self {
        Self {
            current: None,
            previous: None,
        }
    }

    fn key(&self, key_id: &str) -> Result<&Key, StoreError> {
        self.current
            .as_deref()
            .ok_or_else(|| sealed_err(key_id, "no key-encryption key configured"))
    }

    /// A KEK from 64 hex digits (surrounding whitespace ignored).
    pub fn from_hex(text: &str) -> Result<Self, String> {
        let bytes = hex::decode(text.trim())
            .map_err(|e| format!("a key-encryption key is 64 hex digits: {e}"))?;
        Self::from_bytes(&bytes)
    }

    /// A fresh random KEK, as 64 hex digits.
    pub fn generate_hex() -> String {
        let mut bytes = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut bytes);
        hex::encode(bytes)
    }

    /// Reads a KEK file (64 hex digits).
    pub fn from_file(path: &Path) -> Result<Self, StoreError> {
        let text = std::fs::read_to_string(path).map_err(|source| StoreError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_hex(&text)
            .map_err(|e| StoreError::Config(format!("key-encryption key {}: {e}", path.display())))
    }

    /// Reads the KEK file at `path`, creating it (mode 0600, random) first
    /// when it does not exist: the SQLite default beside the database.
    ///
    /// Two processes starting together on a new database may both get here:
    /// the key is written and synced in a file of this process's own first,
    /// then linked to `path`, which fails for the second one; so `path`
    /// only ever appears complete and both read the one key that won.
    pub fn load_or_create(path: &Path) -> Result<Self, StoreError> {
        use std::{io::Write, os::unix::fs::OpenOptionsExt};
        let io = |p: &Path, source| StoreError::Io {
            path: p.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| io(dir, e))?;
        }
        if path.exists() {
            return Self::from_file(path);
        }
        let mut own = path.as_os_str().to_owned();
        own.push(format!(
            ".new-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let own = std::path::PathBuf::from(own);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&own)
            .and_then(|mut f| {
                f.write_all(Self::generate_hex().as_bytes())?;
                f.sync_all()
            })
            .and_then(|()| match std::fs::hard_link(&own, path) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
                _ => Ok(()),
            });
        let _ = std::fs::remove_file(&own);
        written.map_err(|e| io(path, e))?;
        Self::from_file(path)
    }

    /// This KEK, still opening rows sealed with `previous` (a rotation).
    pub fn with_previous(mut self, previous: Kek) -> Self {
        self.previous = previous.current;
        self
    }

    /// Seals the secret of signing key `key_id`.
    pub(super) fn seal(&self, key_id: &str, secret: &[u8]) -> Result<Vec<u8>, StoreError> {
        let current = self.key(key_id)?;
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| sealed_err(key_id, "no randomness for a nonce"))?;
        let mut out = Vec::with_capacity(HEADER + secret.len() + AES_256_GCM.tag_len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&current.id);
        out.extend_from_slice(&nonce);
        let mut body = secret.to_vec();
        current
            .aead
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(key_id.as_bytes()),
                &mut body,
            )
            .map_err(|_| sealed_err(key_id, "sealing failed"))?;
        out.extend_from_slice(&body);
        Ok(out)
    }

    /// Opens a stored secret. A row written before keys were sealed (no
    /// header) is returned as it is; [`Kek::needs_reseal`] says to seal it.
    pub(super) fn open(&self, key_id: &str, stored: &[u8]) -> Result<Vec<u8>, StoreError> {
        if !stored.starts_with(MAGIC) {
            return Ok(stored.to_vec());
        }
        if stored.len() < HEADER + AES_256_GCM.tag_len() {
            return Err(sealed_err(key_id, "sealed secret is truncated"));
        }
        let id = &stored[MAGIC.len()..MAGIC.len() + ID_LEN];
        let current = self.key(key_id)?;
        let key = std::iter::once(current)
            .chain(self.previous.as_deref())
            .find(|k| k.id == id)
            .ok_or_else(|| {
                sealed_err(
                    key_id,
                    &format!(
                        "sealed with key-encryption key {} which is not configured (this one is {})",
                        hex::encode(id),
                        hex::encode(current.id)
                    ),
                )
            })?;
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&stored[MAGIC.len() + ID_LEN..HEADER]);
        let mut body = stored[HEADER..].to_vec();
        let plain = key
            .aead
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(key_id.as_bytes()),
                &mut body,
            )
            .map_err(|_| sealed_err(key_id, "does not open (tampered, or another row's)"))?;
        Ok(plain.to_vec())
    }

    /// Whether a stored secret is unsealed or sealed with a previous KEK
    /// (never, without a KEK).
    pub(super) fn needs_reseal(&self, stored: &[u8]) -> bool {
        let Some(current) = &self.current else {
            return false;
        };
        !stored.starts_with(MAGIC) || stored[MAGIC.len()..].get(..ID_LEN) != Some(&current.id[..])
    }
}

fn sealed_err(key_id: &str, what: &str) -> StoreError {
    StoreError::Sealed {
        key_id: key_id.to_string(),
        what: what.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_secrets_open_only_with_their_kek_and_row() {
        let a = Kek::from_hex(&Kek::generate_hex()).expect("a");
        let b = Kek::from_hex(&Kek::generate_hex()).expect("b");
        let secret = [7u8; 64];
        let sealed = a.seal("k1", &secret).expect("seal");
        assert!(
            !sealed.windows(8).any(|w| w == &secret[..8]),
            "no plaintext"
        );
        assert_eq!(a.open("k1", &sealed).expect("open"), secret);
        assert!(a.open("k2", &sealed).is_err(), "another row's id");
        assert!(b.open("k1", &sealed).is_err(), "another KEK");
        // A rotation: b is current, a previous; the row opens and wants resealing.
        let rotating = b.clone().with_previous(a.clone());
        assert_eq!(rotating.open("k1", &sealed).expect("previous"), secret);
        assert!(rotating.needs_reseal(&sealed));
        assert!(!a.needs_reseal(&sealed));
        assert!(a.needs_reseal(&secret), "a row from before sealing");
        // Two seals of one secret differ (a nonce per row).
        assert_ne!(a.seal("k1", &secret).expect("again"), sealed);
        assert!(Kek::from_hex("abcd").is_err());
    }

    /// Processes starting together on a new SQLite database all create the
    /// KEK file beside it at once: every one reads the same, complete key.
    #[test]
    fn racing_creators_of_the_kek_file_all_read_one_key() {
        use std::os::unix::fs::PermissionsExt;
        for round in 0..20 {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join(format!("cp{round}.db.kek"));
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
            let keys: Vec<_> = (0..8)
                .map(|_| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        Kek::load_or_create(&path).expect("every creator reads a whole key")
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().expect("thread"))
                .collect();
            let sealed = keys[0].seal("k", &[1; 64]).expect("seal");
            for k in &keys {
                assert_eq!(k.open("k", &sealed).expect("the same key"), [1; 64]);
            }
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            let left: Vec<_> = std::fs::read_dir(dir.path())
                .expect("dir")
                .map(|e| e.expect("entry").file_name())
                .collect();
            assert_eq!(left.len(), 1, "only the key file is left: {left:?}");
        }
    }
}
