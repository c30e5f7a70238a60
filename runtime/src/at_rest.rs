//! What a program keeps on disk for itself (its private key, a cached
//! credential, the control plane's key set it trusts), and the checks it
//! makes before trusting any of it, as ssh's `StrictModes` does:
//!
//! - [`check_private_dir`]: the dir holding them must not be writable by
//!   anyone but the process's user (and its own group, see below), and be
//!   owned by that user or root: whoever can write the dir can replace the
//!   files in it (a planted key set makes the program trust forged
//!   credentials; a planted key makes it someone else's identity).
//! - [`check_private_file`]: each such file must be the user's and not
//!   writable by others; read access someone added is taken back (0600),
//!   and the caller says so in its log.
//! - [`write_private`] (atomic, 0600) and [`create_private`] (0600, never
//!   over an existing file unless asked) write them.
//!
//! Group write access is accepted only for the process's own group (its
//! effective gid): Kubernetes' `fsGroup` makes a volume's files and dirs
//! group-writable for the pod's group (the router's key volume), and a
//! user-private group is the user. Parents of the dir are not checked.
//! All I/O here is blocking: call it from `spawn_blocking` or before the
//! runtime serves anything.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};

/// The mode private files are written with and set back to.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Why a private dir or file is not used.
#[derive(Debug, thiserror::Error)]
pub enum AtRestError {
    /// Reading its metadata, or reading, writing or chmod-ing it, failed.
    #[error("{path}: {source}")]
    Io {
        /// The dir or file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
    /// Others may write it (or it is someone else's): what it holds cannot
    /// be trusted, so the program does not start.
    #[error(
        "{what} {path} {why} (mode {mode:04o}, owner uid {uid}, group gid {gid}): \
         refusing to trust what it holds; {fix}"
    )]
    Unsafe {
        /// `data dir`, `key file`, ...
        what: &'static str,
        /// The dir or file.
        path: PathBuf,
        /// What is wrong with it.
        why: &'static str,
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        uid: u32,
        /// Its group.
        gid: u32,
        /// What the operator does about it.
        fix: String,
    },
    /// [`create_private`] found the file there and was not asked to replace it.
    #[error(
        "{0} already exists: not overwritten (ask for it to be replaced, or pick another path)"
    )]
    Exists(PathBuf),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> AtRestError + '_ {
    move |source| AtRestError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Who the process is: (effective uid, effective gid).
fn whoami() -> (u32, u32) {
    (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    )
}

/// What is unsafe about write access `mode` (group `gid`) for a process
/// of group `egid`, if anything.
fn writable_by_others(mode: u32, gid: u32, egid: u32) -> Option<&'static str> {
    if mode & 0o002 != 0 {
        Some("is world-writable")
    } else if mode & 0o020 != 0 && gid != egid {
        Some("is writable by a group that is not the process's own")
    } else {
        None
    }
}

/// Checks that `dir` (`what` names it in the error, e.g. `data dir`) may
/// hold the program's secrets: a dir, owned by the process's user or root,
/// not world-writable and not writable by a group other than the
/// process's own.
pub fn check_private_dir(dir: &Path, what: &'static str) -> Result<(), AtRestError> {
    let meta = fs::metadata(dir).map_err(io_err(dir))?;
    let (euid, egid) = whoami();
    let mode = meta.permissions().mode() & 0o7777;
    let unsafe_ = |why: &'static str, fix: String| AtRestError::Unsafe {
        what,
        path: dir.to_path_buf(),
        why,
        mode,
        uid: meta.uid(),
        gid: meta.gid(),
        fix,
    };
    if !meta.is_dir() {
        return Err(unsafe_(
            "is not a directory",
            "point it at a directory".into(),
        ));
    }
    if meta.uid() != euid && meta.uid() != 0 {
        return Err(unsafe_(
            "belongs to another user",
            format!("chown it to uid {euid} (the user this program runs as)"),
        ));
    }
    if let Some(why) = writable_by_others(mode, meta.gid(), egid) {
        return Err(unsafe_(why, format!("chmod go-w {}", dir.display())));
    }
    Ok(())
}

/// Checks an existing private file (`what` names it, e.g. `key file`): it
/// must be the process's user's and not writable by others (as for
/// [`check_private_dir`]). Read or write access its own group or others
/// were given is taken back (mode 0600): `Ok(Some(old mode))` then, for
/// the caller to log; `Ok(None)` if it was private already or does not
/// exist.
pub fn check_private_file(path: &Path, what: &'static str) -> Result<Option<u32>, AtRestError> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path)(e)),
    };
    let (euid, egid) = whoami();
    let mode = meta.permissions().mode() & 0o7777;
    let unsafe_ = |why: &'static str, fix: String| AtRestError::Unsafe {
        what,
        path: path.to_path_buf(),
        why,
        mode,
        uid: meta.uid(),
        gid: meta.gid(),
        fix,
    };
    if !meta.is_file() {
        return Err(unsafe_("is not a regular file", "remove it".into()));
    }
    if meta.uid() != euid {
        return Err(unsafe_(
            "belongs to another user",
            format!("check who wrote it; remove it (it is made again) or chown it to uid {euid}"),
        ));
    }
    if let Some(why) = writable_by_others(mode, meta.gid(), egid) {
        return Err(unsafe_(
            why,
            format!(
                "check who wrote it; remove it (it is made again) or chmod 600 {}",
                path.display()
            ),
        ));
    }
    if mode & 0o077 == 0 {
        return Ok(None);
    }
    fs::set_permissions(path, fs::Permissions::from_mode(PRIVATE_FILE_MODE))
        .map_err(io_err(path))?;
    Ok(Some(mode))
}

/// Writes `bytes` to a temp file beside `path` with mode 0600, syncs it
/// and renames it over `path`: a reader sees the old file or the new one.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), AtRestError> {
    let tmp = path.with_extension("tmp");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(PRIVATE_FILE_MODE)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    // An old temp file keeps its mode through `open`: set it.
    f.set_permissions(fs::Permissions::from_mode(PRIVATE_FILE_MODE))
        .map_err(io_err(&tmp))?;
    f.write_all(bytes).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    drop(f);
    fs::rename(&tmp, path).map_err(io_err(path))
}

/// Creates `path` with mode 0600 holding `bytes`: a new file only, unless
/// `replace` (then an existing one is replaced atomically, as
/// [`write_private`] does). Its missing parent dirs are made 0700.
pub fn create_private(path: &Path, bytes: &[u8], replace: bool) -> Result<(), AtRestError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_err(dir))?;
    }
    if replace {
        return write_private(path, bytes);
    }
    let mut f = match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(PRIVATE_FILE_MODE)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(AtRestError::Exists(path.to_path_buf()));
        }
        Err(e) => return Err(io_err(path)(e)),
    };
    f.write_all(bytes).map_err(io_err(path))?;
    f.sync_all().map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode_of(p: &Path) -> u32 {
        fs::metadata(p).expect("meta").permissions().mode() & 0o7777
    }

    fn chmod(p: &Path, mode: u32) {
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn a_dir_writable_by_others_is_refused_naming_path_and_mode() {
        let d = tempfile::tempdir().expect("tempdir");
        check_private_dir(d.path(), "data dir").expect("0700 is private");
        chmod(d.path(), 0o755);
        check_private_dir(d.path(), "data dir").expect("readable is fine");
        chmod(d.path(), 0o777);
        let e = check_private_dir(d.path(), "data dir").expect_err("world-writable");
        let text = e.to_string();
        assert!(text.contains(&d.path().display().to_string()), "{text}");
        assert!(
            text.contains("world-writable") && text.contains("0777"),
            "{text}"
        );
        assert!(text.starts_with("data dir "), "{text}");
        // Sticky (/tmp-like) is still world-writable: others may plant files.
        chmod(d.path(), 0o1777);
        assert!(check_private_dir(d.path(), "data dir").is_err());
    }

    #[test]
    fn group_write_is_accepted_for_the_processs_own_group_only() {
        let egid = nix::unistd::getegid().as_raw();
        assert_eq!(writable_by_others(0o770, egid, egid), None);
        assert_eq!(writable_by_others(0o2775, egid, egid), None);
        assert!(writable_by_others(0o770, egid.wrapping_add(1), egid).is_some());
        assert!(writable_by_others(0o757, egid, egid).is_some());
        assert_eq!(writable_by_others(0o755, egid.wrapping_add(1), egid), None);
    }

    #[test]
    fn a_loosened_file_is_set_back_to_0600_and_a_writable_one_refused() {
        let d = tempfile::tempdir().expect("tempdir");
        let f = d.path().join("node.key");
        assert_eq!(check_private_file(&f, "key file").expect("missing"), None);
        write_private(&f, b"key").expect("write");
        assert_eq!(mode_of(&f), 0o600);
        assert_eq!(check_private_file(&f, "key file").expect("private"), None);
        chmod(&f, 0o644);
        assert_eq!(
            check_private_file(&f, "key file").expect("tightened"),
            Some(0o644)
        );
        assert_eq!(mode_of(&f), 0o600);
        chmod(&f, 0o666);
        let e = check_private_file(&f, "key file").expect_err("world-writable");
        assert!(e.to_string().contains("0666"), "{e}");
        assert_eq!(
            mode_of(&f),
            0o666,
            "a refused file is left for the operator"
        );
    }

    #[test]
    fn a_file_or_dir_of_another_user_is_refused() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: chown needs root");
            return;
        }
        let d = tempfile::tempdir().expect("tempdir");
        let f = d.path().join("keys.pb");
        write_private(&f, b"keys").expect("write");
        std::os::unix::fs::chown(&f, Some(54_321), None).expect("chown");
        let e = check_private_file(&f, "key set").expect_err("foreign");
        assert!(e.to_string().contains("another user"), "{e}");
        // A dir of root's is fine (volume roots); another user's is not.
        check_private_dir(d.path(), "data dir").expect("root's own");
        std::os::unix::fs::chown(d.path(), Some(54_321), None).expect("chown");
        assert!(check_private_dir(d.path(), "data dir").is_err());
    }

    #[test]
    fn create_private_never_overwrites_unless_asked() {
        let d = tempfile::tempdir().expect("tempdir");
        let f = d.path().join("sub").join("member.token");
        create_private(&f, b"one", false).expect("create");
        assert_eq!(mode_of(&f), 0o600);
        assert_eq!(mode_of(&d.path().join("sub")), 0o700);
        let e = create_private(&f, b"two", false).expect_err("exists");
        assert!(matches!(e, AtRestError::Exists(_)), "{e}");
        assert_eq!(fs::read(&f).expect("read"), b"one");
        chmod(&f, 0o644);
        create_private(&f, b"two", true).expect("replace");
        assert_eq!(fs::read(&f).expect("read"), b"two");
        assert_eq!(mode_of(&f), 0o600);
    }
}
