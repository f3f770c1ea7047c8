//! Files served in place: the blocks of a version this node published with `locale=local` or
//! fetched and seeds, read straight from the files that hold them, never copied.
//!
//! A registration records, per block, where it lies (path, offset) and what the file looked like
//! then (device, inode, size, mtime); a caller on the node shows it holds each block's bytes by
//! having them hashed then ([`Check::Hashes`]). Before a block goes out, the file is checked to
//! be that one, unchanged, and the bytes hashed, so a file changed or swapped after publishing is
//! never served as the published block.

use std::collections::HashMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use bytes::Bytes;
use prost::Message;

use super::in_flight::{Checked, Hashed};
use super::BlockError;
use crate::db::{BatchOp, Db, DbError};
use crate::hash::{BlockHash, Version};
use crate::manifest::{self, EntryKind, FileEntry, Manifest};
use crate::proto::{LocalBlock, LocalBlocks, LocalFile};

/// Where each registered block lies on this node.
pub const CF_LOCAL: &str = "local";
/// The copies this node seeds (a get handed it the files): per version and copy (the key is
/// the version, then 8 bytes of the hash of the copy's paths, so two gets of one version to
/// two places are two records), the copy's files as they were then (`LocalBlocks`, one place
/// per file: path, size, mtime), so that a version none of whose copies is whole any more is
/// withdrawn from the store server's sources.
pub const CF_SEEDS: &str = "seeds";
/// Places kept per block; older places are tried first and dropped first.
const MAX_PLACES: usize = 8;

/// How much a registration trusts its caller's manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// Every block is read and hashed: the caller is a process on the node (through the agent's
    /// socket), which must show it holds the bytes it publishes (or seeds) under a hash. Without
    /// it, a manifest naming another tenant's hash beside a file of its own would make this node
    /// serve that hash from the other tenant's place.
    Hashes,
    /// Sizes only: the manifest was made from these very files by this process (a mount's
    /// staged file, hashed as it was published).
    Sizes,
}

#[derive(Debug, thiserror::Error)]
pub enum InPlaceError {
    #[error("the manifest has no file entry {0:?}")]
    NoEntry(String),
    #[error("disk path {0} is not absolute")]
    NotAbsolute(String),
    #[error("{path}: {source}")]
    Disk {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} changed since it was scanned")]
    Changed(String),
    #[error("the manifest of {0:?} names a malformed block hash")]
    BadHash(String),
    #[error("{path}: block {index} does not hold the bytes the manifest names")]
    NotItsBlock { path: String, index: usize },
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("a stored place of a block is corrupt: {0}")]
    Corrupt(#[from] prost::DecodeError),
}

/// The file entry of `m` that a local file claims to hold, and the file's absolute path.
pub fn entry_of<'m>(m: &'m Manifest, f: &LocalFile) -> Result<&'m FileEntry, InPlaceError> {
    if !Path::new(&f.disk_path).is_absolute() {
        return Err(InPlaceError::NotAbsolute(f.disk_path.clone()));
    }
    m.entries
        .iter()
        .find(|e| e.path == f.entry_path && e.kind() == EntryKind::File)
        .ok_or_else(|| InPlaceError::NoEntry(f.entry_path.clone()))
}

/// The registered places of blocks, in the node's database.
pub struct InPlace {
    db: Db,
}

impl InPlace {
    pub fn new(db: Db) -> Self {
        InPlace { db }
    }

    fn places(&self, hash: &BlockHash) -> Result<Vec<LocalBlock>, InPlaceError> {
        match self.db.get(CF_LOCAL, hash.as_bytes())? {
            Some(v) => Ok(LocalBlocks::decode(v.as_slice())?.places),
            None => Ok(Vec::new()),
        }
    }

    /// Registers files on disk as holding the blocks of `m`, in place. Returns the number of
    /// blocks registered.
    pub fn register(
        &self,
        m: &Manifest,
        files: &[LocalFile],
        check: Check,
        open: Opener<'_>,
    ) -> Result<usize, InPlaceError> {
        self.register_known(m, files, check, &HashMap::new(), open)
    }

    /// As [`InPlace::register`], but what `known` says was hashed of a block where it lies (by
    /// this agent, at that place of that file, as it served it in flight) is not hashed again:
    /// the whole block, or the pieces marked.
    pub fn register_known(
        &self,
        m: &Manifest,
        files: &[LocalFile],
        check: Check,
        known: &HashMap<Checked, Hashed>,
        open: Opener<'_>,
    ) -> Result<usize, InPlaceError> {
        let mut ops = Vec::new();
        let mut count = 0;
        let mut buf = Vec::new();
        for f in files {
            let entry = entry_of(m, f)?;
            let disk = Path::new(&f.disk_path);
            let file = open(disk).map_err(|source| InPlaceError::Disk {
                path: f.disk_path.clone(),
                source,
            })?;
            let meta = file.metadata().map_err(|source| InPlaceError::Disk {
                path: f.disk_path.clone(),
                source,
            })?;
            if meta.len() != entry.size {
                return Err(InPlaceError::Changed(f.disk_path.clone()));
            }
            let at = resolved_path(&file, &f.disk_path);
            let mut offset = 0u64;
            for (index, b) in entry.blocks.iter().enumerate() {
                let hash = manifest::block_hash(b)
                    .ok_or_else(|| InPlaceError::BadHash(entry.path.clone()))?;
                let hashed_here = Checked {
                    dev: meta.dev(),
                    ino: meta.ino(),
                    offset,
                    hash,
                };
                if check == Check::Hashes {
                    let read = |buf: &mut Vec<u8>, at: u64, len: u64| {
                        buf.resize(len as usize, 0);
                        file.read_exact_at(buf, at)
                            .map_err(|source| InPlaceError::Disk {
                                path: f.disk_path.clone(),
                                source,
                            })
                    };
                    let holds = match known.get(&hashed_here) {
                        Some(Hashed::Whole) => true,
                        Some(Hashed::Pieces { cut, cvs, done })
                            if cut.len() == u64::from(b.len) =>
                        {
                            let mut holds = true;
                            for (i, _) in (0..).zip(done).filter(|(_, &d)| !d) {
                                let Some(r) = cut.range(i) else {
                                    holds = false;
                                    break;
                                };
                                read(&mut buf, offset + r.start, r.end - r.start)?;
                                if !cut.check_piece(cvs, i, &buf) {
                                    holds = false;
                                    break;
                                }
                            }
                            holds
                        }
                        _ => {
                            read(&mut buf, offset, u64::from(b.len))?;
                            BlockHash::of(&buf) == hash
                        }
                    };
                    if !holds {
                        return Err(InPlaceError::NotItsBlock {
                            path: f.disk_path.clone(),
                            index,
                        });
                    }
                }
                let mut places = self.places(&hash)?;
                places.retain(|p| p.disk_path != at || p.offset != offset);
                places.push(LocalBlock {
                    disk_path: at.clone(),
                    offset,
                    len: b.len,
                    file_size: meta.len(),
                    mtime_sec: meta.mtime(),
                    mtime_nsec: meta.mtime_nsec() as u32,
                    dev: meta.dev(),
                    ino: meta.ino(),
                });
                if places.len() > MAX_PLACES {
                    places.remove(0);
                }
                ops.push(BatchOp::Put(
                    CF_LOCAL,
                    hash.0.to_vec(),
                    LocalBlocks { places }.encode_to_vec(),
                ));
                offset += u64::from(b.len);
                count += 1;
            }
        }
        self.db.write(ops)?;
        Ok(count)
    }

    /// Records that this node seeds `version` from `files` (registered already), as they are
    /// now.
    pub fn record_seed(
        &self,
        version: &Version,
        files: &[LocalFile],
        open: Opener<'_>,
    ) -> Result<(), InPlaceError> {
        let mut places = Vec::with_capacity(files.len());
        for f in files {
            let disk = |source| InPlaceError::Disk {
                path: f.disk_path.clone(),
                source,
            };
            let file = open(Path::new(&f.disk_path)).map_err(disk)?;
            let meta = file.metadata().map_err(disk)?;
            places.push(LocalBlock {
                disk_path: resolved_path(&file, &f.disk_path),
                offset: 0,
                len: 0,
                file_size: meta.len(),
                mtime_sec: meta.mtime(),
                mtime_nsec: meta.mtime_nsec() as u32,
                dev: meta.dev(),
                ino: meta.ino(),
            });
        }
        let mut paths = blake3::Hasher::new();
        for p in &places {
            paths.update(p.disk_path.as_bytes());
            paths.update(b"\0");
        }
        let mut key = version.0.to_vec();
        key.extend_from_slice(&paths.finalize().as_bytes()[..8]);
        self.db
            .put(CF_SEEDS, &key, &LocalBlocks { places }.encode_to_vec())?;
        Ok(())
    }

    /// Whether the copy a seed record describes is there as it was recorded.
    fn whole(record: &[u8]) -> bool {
        let record = LocalBlocks::decode(record).unwrap_or_default();
        !record.places.is_empty()
            && record.places.iter().all(|p| {
                std::fs::metadata(&p.disk_path).is_ok_and(|m| {
                    m.len() == p.file_size
                        && m.mtime() == p.mtime_sec
                        && m.mtime_nsec() as u32 == p.mtime_nsec
                })
            })
    }

    /// The seeded versions none of whose copies is whole any more (a file gone or changed),
    /// among the records from `cursor` on with about `max_files` files in all (a stat each):
    /// what the store server should no longer list this node for, and where the next sweep
    /// begins (the start again after the last). A broken copy of a version that has a whole one
    /// is forgotten at once; the versions returned stay recorded until
    /// [`InPlace::forget_seeds`], once the server was told (a crash before that tells it again).
    pub fn sweep_seeds(
        &self,
        cursor: &[u8],
        max_files: usize,
    ) -> Result<(Vec<Version>, Vec<u8>), InPlaceError> {
        let (mut broken, mut seen, mut next) = (Vec::new(), 0usize, Vec::new());
        self.db.walk_from(CF_SEEDS, cursor, |k, v| {
            if seen >= max_files {
                next = k.to_vec();
                return false;
            }
            seen += LocalBlocks::decode(v).map_or(1, |r| r.places.len().max(1));
            if !Self::whole(v) {
                broken.push(k.to_vec());
            }
            true
        })?;
        let mut gone: Vec<Version> = Vec::new();
        for k in broken {
            let Some(version) = k.get(..32).and_then(Version::from_slice) else {
                self.db.delete(CF_SEEDS, &k)?;
                continue;
            };
            if gone.contains(&version) {
                continue;
            }
            let others = self.db.scan_prefix(CF_SEEDS, &version.0)?;
            if others.iter().any(|(o, v)| *o != k && Self::whole(v)) {
                self.db.delete(CF_SEEDS, &k)?;
            } else {
                gone.push(version);
            }
        }
        Ok((gone, next))
    }

    /// Forgets seeded versions (every copy of each) the store server was told are gone.
    pub fn forget_seeds(&self, versions: &[Version]) -> Result<(), InPlaceError> {
        let mut ops = Vec::new();
        for v in versions {
            for (k, _) in self.db.scan_prefix(CF_SEEDS, &v.0)? {
                ops.push(BatchOp::Delete(CF_SEEDS, k));
            }
        }
        self.db.write(ops)?;
        Ok(())
    }

    /// Forgets the places of blocks no live version holds any more; how many were here. The
    /// files stay: they are their writer's.
    pub fn forget(&self, hashes: &[BlockHash]) -> Result<usize, BlockError> {
        let mut ops = Vec::new();
        for h in hashes {
            if self.db.get(CF_LOCAL, h.as_bytes())?.is_some() {
                ops.push(BatchOp::Delete(CF_LOCAL, h.0.to_vec()));
            }
        }
        let n = ops.len();
        if n > 0 {
            self.db.write(ops)?;
        }
        Ok(n)
    }

    /// The block from a registered file that still holds it unchanged.
    pub fn find(&self, hash: &BlockHash) -> Result<Option<Bytes>, BlockError> {
        let places = match self.places(hash) {
            Ok(p) => p,
            Err(InPlaceError::Db(e)) => return Err(e.into()),
            Err(e) => {
                tracing::warn!(block = %hash, error = %e, "unreadable places of a block");
                return Ok(None);
            }
        };
        Ok(places.iter().find_map(|p| read_place(p, hash)))
    }

    /// `len` bytes from `start` of a block served in place, unchecked: the caller checks them
    /// (a piece against its chaining value). `None` where no unchanged file holds the block.
    pub fn read_range(&self, hash: &BlockHash, start: u64, len: usize) -> Option<Bytes> {
        let places = self.places(hash).ok()?;
        places.iter().find_map(|p| {
            if start.checked_add(len as u64)? > u64::from(p.len) {
                return None;
            }
            let f = open_unchanged(p)?;
            let mut buf = vec![0u8; len];
            f.read_exact_at(&mut buf, p.offset + start).ok()?;
            Some(Bytes::from(buf))
        })
    }
}

/// Opens a file for reading without blocking (a FIFO with no writer would hold the thread),
/// and only if it is a regular file.
pub fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok(f)
}

/// Opens a registered file again, following no symbolic link on the way (`openat2` with
/// `RESOLVE_NO_SYMLINKS`; the path was recorded resolved, [`resolved_path`]): a path swapped
/// for a link to a device or a FIFO is refused before the target is opened (opening some
/// devices does something: a watchdog arms), not after. Without blocking, regular files only.
fn open_in_place(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: an all-zero open_how is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_NO_SYMLINKS;
    // SAFETY: a valid C string and an open_how of the size passed; the kernel returns a new
    // descriptor this function then owns, or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    let file = match fd {
        -1 => {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOSYS) {
                return Err(e);
            }
            // A kernel before 5.6: no link as the last component, at least.
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOFOLLOW)
                .open(path)?
        }
        // SAFETY: a descriptor the kernel just returned, owned by no one else.
        fd => unsafe { std::fs::File::from_raw_fd(fd as i32) },
    };
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok(file)
}

/// The path of an open file with every link resolved, as the agent sees it (where a
/// registration records it, for [`open_in_place`]); `given` where the kernel cannot say.
fn resolved_path(file: &std::fs::File, given: &str) -> String {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()
        .and_then(|p| p.into_os_string().into_string().ok())
        .filter(|p| p.starts_with('/') && !p.ends_with(" (deleted)"))
        .unwrap_or_else(|| given.to_string())
}

/// How a registration opens the files it is handed: as the agent ([`open_regular`]), or with
/// the rights of the process that handed them (the agent's socket); regular files only.
pub type Opener<'a> = &'a (dyn Fn(&Path) -> std::io::Result<std::fs::File> + Sync);

/// The file of a place, if it is as it was registered (a regular file, of its size and
/// modification time). Opened without blocking: a file swapped for a FIFO with no writer held
/// a blocking thread for good.
fn open_unchanged(p: &LocalBlock) -> Option<std::fs::File> {
    let f = match open_in_place(Path::new(&p.disk_path)) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            tracing::warn!(path = %p.disk_path, "published file is no longer a regular file; not serving it");
            return None;
        }
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            tracing::warn!(path = %p.disk_path, "published path goes through a symbolic link now; not serving it");
            return None;
        }
        Err(_) => return None,
    };
    let meta = f.metadata().ok()?;
    if p.ino != 0 && (meta.dev() != p.dev || meta.ino() != p.ino) {
        tracing::warn!(path = %p.disk_path, "published path names another file now; not serving it");
        return None;
    }
    if meta.len() != p.file_size
        || meta.mtime() != p.mtime_sec
        || meta.mtime_nsec() as u32 != p.mtime_nsec
    {
        tracing::warn!(path = %p.disk_path, "published file changed on disk; not serving it");
        return None;
    }
    Some(f)
}

fn read_place(p: &LocalBlock, hash: &BlockHash) -> Option<Bytes> {
    let f = open_unchanged(p)?;
    let mut buf = vec![0u8; p.len as usize];
    f.read_exact_at(&mut buf, p.offset).ok()?;
    if BlockHash::of(&buf) != *hash {
        tracing::warn!(path = %p.disk_path, block = %hash, "published file no longer matches its hash; not serving it");
        return None;
    }
    Some(Bytes::from(buf))
}

#[cfg(test)]
mod tests;
