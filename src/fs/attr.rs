//! What the filesystem shows of an entry (its kind and attributes, a directory's entries) and
//! who asks: plain values every part of the core passes around.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::manifest::EntryKind;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// Special files: the kernel does their I/O (a fifo's pipe, a socket's bind); the mount is
    /// nodev, so device nodes never open.
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// What `stat` shows.
#[derive(Clone, Debug)]
pub struct Attr {
    pub ino: u64,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub mtime: SystemTime,
    /// When it was last read on this node (relatime), or set by utimens here: node-local,
    /// never published; the mtime until then.
    pub atime: SystemTime,
    /// When the metadata or content last changed (shared, as the store server stamped it).
    pub ctime: SystemTime,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// A device node's number.
    pub rdev: u32,
}

#[derive(Clone, Debug)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: Kind,
    pub name: String,
}

/// Who asks: the process, and the ids a new file of its is owned by.
#[derive(Clone, Copy, Debug)]
pub struct Caller {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Seconds and nanoseconds since the epoch (before it too, as 64-bit time allows) as a time.
pub(crate) fn time_of(sec: i64, nsec: u32) -> SystemTime {
    let nsec = Duration::from_nanos(u64::from(nsec.min(999_999_999)));
    let t = if sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(sec as u64))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(sec.unsigned_abs()))
    };
    t.and_then(|t| t.checked_add(nsec)).unwrap_or(UNIX_EPOCH)
}

/// A time as seconds and nanoseconds since the epoch, the nanoseconds always forward.
pub(crate) fn to_unix(t: SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            match d.subsec_nanos() {
                0 => (-(d.as_secs() as i64), 0),
                n => (-(d.as_secs() as i64) - 1, 1_000_000_000 - n),
            }
        }
    }
}

pub(crate) fn kind_of(k: EntryKind) -> Kind {
    match k {
        EntryKind::File => Kind::File,
        EntryKind::Directory => Kind::Dir,
        EntryKind::Symlink => Kind::Symlink,
        EntryKind::Fifo => Kind::Fifo,
        EntryKind::Socket => Kind::Socket,
        EntryKind::CharDevice => Kind::CharDevice,
        EntryKind::BlockDevice => Kind::BlockDevice,
        // Never listed (see `fetch_listing`); were one met, it has no bytes to read as a file.
        EntryKind::Gpu => Kind::File,
    }
}
