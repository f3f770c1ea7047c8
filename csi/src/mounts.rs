//! The mount table (`/proc/self/mountinfo`) and the mount system calls kt-csi makes: bind
//! mounts of a namespace mount's subdirectory onto a pod's target path, read-only remounts and
//! unmounts.

use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use kt_host::mountinfo::unescape;
use nix::mount::{MntFlags, MsFlags};

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("reading the mount table: {0}")]
    Table(#[source] std::io::Error),
    #[error("bind-mounting {src} on {dst}: {errno}")]
    Bind {
        src: PathBuf,
        dst: PathBuf,
        errno: nix::Error,
    },
    #[error("remounting {path} read-only: {errno}")]
    Remount { path: PathBuf, errno: nix::Error },
    #[error("unmounting {path}: {errno}")]
    Unmount { path: PathBuf, errno: nix::Error },
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The directory of the mounted filesystem that is seen at `mount_point` (`/` for a whole
    /// filesystem, `/a/b` for a bind mount of its subdirectory `a/b`).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`/`ro`, `nosuid`, ...).
    pub options: String,
    pub fstype: String,
    pub source: String,
}

impl MountEntry {
    pub fn read_only(&self) -> bool {
        self.options.split(',').any(|o| o == "ro")
    }

    /// Whether this is a ktfs FUSE mount (or a bind of one) of namespace `ns`: the agent
    /// mounts with the fs name `ktfs:NS`.
    pub fn is_ktfs(&self, ns: &str) -> bool {
        self.fstype.starts_with("fuse") && self.source == format!("ktfs:{ns}")
    }
}

/// Parses the text of a mountinfo file; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let mut post = post.split(' ');
            if pre.len() < 6 {
                return None;
            }
            Some(MountEntry {
                root: unescape(pre[3]),
                mount_point: unescape(pre[4]),
                options: pre[5].to_string(),
                fstype: post.next()?.to_string(),
                source: unescape(post.next()?).to_string_lossy().into_owned(),
            })
        })
        .collect()
}

pub fn read_mountinfo() -> Result<Vec<MountEntry>, MountError> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .map_err(MountError::Table)
}

/// The mount seen at `path` (the last one stacked there), if `path` is a mount point.
pub fn lookup(path: &Path) -> Result<Option<MountEntry>, MountError> {
    let path = normalize(path);
    Ok(read_mountinfo()?
        .into_iter()
        .rev()
        .find(|e| e.mount_point == path))
}

/// An absolute, lexically clean form of `path` with its parent's symlinks resolved, computed
/// without touching `path` itself (a dead FUSE mount there fails every stat).
pub fn normalize(path: &Path) -> PathBuf {
    let mut clean = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                clean.pop();
            }
            Component::CurDir => {}
            other => clean.push(other),
        }
    }
    match (clean.parent(), clean.file_name()) {
        (Some(parent), Some(name)) => parent
            .canonicalize()
            .map(|p| p.join(name))
            .unwrap_or(clean.clone()),
        _ => clean,
    }
}

/// What a stat of a path says within a time limit.
#[derive(Debug)]
pub enum Probe {
    Answers,
    /// An error, e.g. ENOTCONN: a FUSE mount whose daemon died.
    Fails(std::io::Error),
    /// No answer in time: a FUSE mount whose daemon hangs.
    Hangs,
}

/// Stats `path` on a helper thread, waiting at most `limit`.
pub fn probe(path: &Path, limit: Duration) -> Probe {
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("kt-csi-stat".into())
        .spawn(move || {
            let _ = tx.send(std::fs::metadata(&p).map(drop));
        });
    if let Err(e) = spawned {
        return Probe::Fails(e);
    }
    match rx.recv_timeout(limit) {
        Ok(Ok(())) => Probe::Answers,
        Ok(Err(e)) => Probe::Fails(e),
        Err(_) => Probe::Hangs,
    }
}

/// `mount --bind src dst`.
pub fn bind(src: &Path, dst: &Path) -> Result<(), MountError> {
    nix::mount::mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(
        |errno| MountError::Bind {
            src: src.to_path_buf(),
            dst: dst.to_path_buf(),
            errno,
        },
    )
}

/// `mount -o remount,bind,ro dst`: the bind mount at `path` refuses writes with EROFS; the
/// filesystem below (shared by other volumes) stays read-write.
pub fn remount_read_only(path: &Path) -> Result<(), MountError> {
    // nosuid and nodev are kept: the ktfs mount has them and a remount may not drop them.
    let flags = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV;
    nix::mount::mount(None::<&str>, path, None::<&str>, flags, None::<&str>).map_err(|errno| {
        MountError::Remount {
            path: path.to_path_buf(),
            errno,
        }
    })
}

/// Unmounts `path`; when it is busy (a file still open), detaches it instead: it disappears
/// from the namespace at once and goes away when the last file closes.
pub fn unmount(path: &Path) -> Result<(), MountError> {
    match nix::mount::umount2(path, MntFlags::empty()) {
        Ok(()) => Ok(()),
        Err(nix::Error::EBUSY) => detach(path),
        Err(errno) => Err(MountError::Unmount {
            path: path.to_path_buf(),
            errno,
        }),
    }
}

/// `umount -l path`.
pub fn detach(path: &Path) -> Result<(), MountError> {
    nix::mount::umount2(path, MntFlags::MNT_DETACH).map_err(|errno| MountError::Unmount {
        path: path.to_path_buf(),
        errno,
    })
}

/// The path as a C-compatible byte string, for the xattr call.
pub(crate) fn c_path(path: &Path) -> Option<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_bytes()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
1494 27 0:72 / /var/lib/kt-csi/mounts/default rw,nosuid,nodev,relatime shared:600 - fuse ktfs:default rw,user_id=0,group_id=0,default_permissions,allow_other
1500 27 0:72 /team/data /tmp/pod\\040a/mount ro,nosuid,nodev,relatime shared:600 - fuse ktfs:default rw,user_id=0
garbage line
";

    #[test]
    fn parses_mountinfo_with_escapes_and_binds() {
        let m = parse_mountinfo(SAMPLE);
        assert_eq!(m.len(), 3);
        assert_eq!(
            m[1].mount_point,
            Path::new("/var/lib/kt-csi/mounts/default")
        );
        assert!(m[1].is_ktfs("default") && !m[1].is_ktfs("other") && !m[1].read_only());
        assert_eq!(m[2].mount_point, Path::new("/tmp/pod a/mount"));
        assert_eq!(m[2].root, Path::new("/team/data"));
        assert!(m[2].read_only());
        assert!(!m[0].is_ktfs("default"));
    }

    #[test]
    fn normalizes_without_touching_the_leaf() {
        assert_eq!(
            normalize(Path::new("/proc/self/../self/./nonexistent-leaf")),
            Path::new("/proc")
                .join("self")
                .canonicalize()
                .unwrap()
                .join("nonexistent-leaf")
        );
    }
}
