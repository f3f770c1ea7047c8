//! The store server's large blocks as plain files named by their hash, next to the RocksDB that
//! indexes them.
//!
//! Why files: the store server's work is serving blocks, and a block in a file goes from the
//! page cache to the socket with sendfile(2), never through the process. Served out of RocksDB's
//! blob files, every byte was read into RocksDB's buffer, copied out of it, copied into ours and
//! copied once more into the socket: measured, that was three quarters of the server's CPU on a
//! 1 GiB `kt get` and kept the get at half the speed of a plain TCP copy. Small blocks stay in
//! RocksDB, where many of them cost less than as many files. The index (`store::CF_BLOCK_INDEX`)
//! says which blocks exist and where.
//!
//! A node's block cache keeps its large blocks the same way (`cache`), written with O_DIRECT:
//! what a mount reads already sits in the kernel's page cache under the FUSE file, and a second
//! copy under the cache file would only double the memory and the copying. Measured on a cold
//! 1 GiB read through a fresh mount, alternated run by run (medians of 4): the mount's CPU
//! 2.2 -> 1.7 s, its time 2.33 -> 2.09 s. Blocks are received page-aligned (`transfer::wire`), so
//! this costs no copy. The price: a peer asking for a block just cached here is served from
//! the disk, not from memory.
//!
//! A block is written to a temporary name and renamed, so a file under its hash is always whole.
//! Writes are not synced one by one: the publish that first needs them syncs them all
//! ([`BlockFiles::sync`]) before it makes the index durable, so the index never names a block
//! that a crash could have lost.

use std::fs::File;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::BlockError;
use crate::hash::BlockHash;
use crate::locks::lock;

/// Blocks at least this large are files, in the store and in a node's cache; smaller ones stay
/// in RocksDB, where many of them cost less than as many files.
pub const MIN_FILE_BLOCK: usize = 64 << 10;

/// Unsynced blocks beyond this many are synced by the writer itself, so that an upload that is
/// never published does not grow the list without bound.
const MAX_UNSYNCED: usize = 4096;

/// Makes `dir` (and what is missing above it) and gives it to its owner alone (0700), whatever
/// mode it had: what a daemon keeps below it (blocks, staged files, a node's cache, the
/// metadata) is other users' data, and a directory no one else may enter hides it whatever the
/// modes inside (those an older build wrote, or a file staged with its writer's mode).
pub fn private_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

pub struct BlockFiles {
    dir: PathBuf,
    /// Whether writes are tracked for [`BlockFiles::sync`] (the store); a cache's are not.
    durable: bool,
    /// Blocks written since the last [`BlockFiles::sync`].
    unsynced: Mutex<Vec<BlockHash>>,
    /// Makes temporary names unique among concurrent writers of one block.
    tmp_seq: AtomicU64,
}

impl BlockFiles {
    /// Opens (creating) the block directory and removes the temporary files of writes that a
    /// crash interrupted.
    /// Bytes free on the disk of the files; `None` if it cannot be asked.
    pub fn free_bytes(&self) -> Option<u64> {
        let st = nix::sys::statvfs::statvfs(&self.dir).ok()?;
        Some(st.blocks_available() as u64 * st.fragment_size() as u64)
    }

    pub fn open(dir: &Path) -> io::Result<Self> {
        Self::scan(dir)?;
        Ok(Self::new(dir, true))
    }

    /// Like [`BlockFiles::open`], for a cache: writes are never synced, and a block lost in a
    /// crash (or left half-written by one) is found out by its hash when read and fetched again.
    /// Also returns the hash of every block file found, in no order.
    pub fn open_volatile(dir: &Path) -> io::Result<(Self, Vec<BlockHash>)> {
        let found = Self::scan(dir)?;
        Ok((Self::new(dir, false), found))
    }

    fn new(dir: &Path, durable: bool) -> Self {
        BlockFiles {
            dir: dir.to_path_buf(),
            durable,
            unsynced: Mutex::new(Vec::new()),
            tmp_seq: AtomicU64::new(0),
        }
    }

    /// The hashes of the block files, in no order (temporary files left alone: they may be
    /// writes in progress).
    pub fn list(&self) -> io::Result<Vec<BlockHash>> {
        Self::walk(&self.dir, false)
    }

    /// One pass over the fan-out directories: removes temporary files, returns the hashes of
    /// the block files.
    fn scan(dir: &Path) -> io::Result<Vec<BlockHash>> {
        private_dir(dir)?;
        Self::walk(dir, true)
    }

    fn walk(dir: &Path, remove_tmp: bool) -> io::Result<Vec<BlockHash>> {
        let mut found = Vec::new();
        for fan in std::fs::read_dir(dir)? {
            let fan = fan?;
            if !fan.file_type()?.is_dir() {
                continue;
            }
            for entry in std::fs::read_dir(fan.path())? {
                let entry = entry?;
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.contains(".tmp") {
                    if remove_tmp {
                        std::fs::remove_file(entry.path())?;
                    }
                } else if let Ok(h) = blake3::Hash::from_hex(name.as_bytes()) {
                    found.push(BlockHash(*h.as_bytes()));
                }
            }
        }
        Ok(found)
    }

    /// A failure of these files, saying where they are.
    pub fn error(&self, source: io::Error) -> BlockError {
        BlockError::Files {
            dir: self.dir.display().to_string(),
            source,
        }
    }

    /// Deletes a block's file; one already gone is no error.
    pub fn remove(&self, hash: &BlockHash) -> io::Result<()> {
        lock(&self.unsynced).retain(|h| h != hash);
        match std::fs::remove_file(self.path(hash)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// `DIR/ab/abcdef...`: 256 fan-out directories keep each directory small.
    fn path(&self, hash: &BlockHash) -> PathBuf {
        let hex = hash.hex();
        self.dir.join(&hex[..2]).join(hex)
    }

    /// Writes a block (whose bytes the caller has verified against `hash`).
    pub fn write(&self, hash: &BlockHash, data: &[u8]) -> io::Result<()> {
        let path = self.path(hash);
        let parent = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(parent)?;
        let seq = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = parent.join(format!("{}.tmp{seq}", hash.hex()));
        // A cache's blocks skip the page cache; the store's are read back soon after (sendfile
        // to getters, the publish's fsync) and stay there.
        let written = if !self.durable && data.len().is_multiple_of(DIRECT_ALIGN) {
            write_direct(&tmp, data)
        } else {
            File::create(&tmp).and_then(|f| {
                super::pieces::write_all(&f, data)?;
                if self.durable {
                    start_writeback(&f);
                }
                Ok(())
            })
        };
        let written = written.and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        if !self.durable {
            return Ok(());
        }
        let full = {
            let mut unsynced = lock(&self.unsynced);
            unsynced.push(*hash);
            unsynced.len() >= MAX_UNSYNCED
        };
        if full {
            self.sync()?;
        }
        Ok(())
    }

    /// The block's file and its length, or `None` if there is no such file.
    pub fn open_block(&self, hash: &BlockHash) -> io::Result<Option<(File, u64)>> {
        match File::open(self.path(hash)) {
            Ok(f) => {
                let len = f.metadata()?.len();
                Ok(Some((f, len)))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The block's bytes, or `None` if there is no such file.
    pub fn read(&self, hash: &BlockHash) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(self.path(hash)) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether the block's file is there.
    pub fn exists(&self, hash: &BlockHash) -> bool {
        self.path(hash).is_file()
    }

    /// Makes every block written so far durable: their data, then the directory entries that
    /// name them.
    pub fn sync(&self) -> io::Result<()> {
        let pending = std::mem::take(&mut *lock(&self.unsynced));
        let mut dirs = std::collections::BTreeSet::new();
        let synced = pending.iter().try_for_each(|hash| {
            let path = self.path(hash);
            match File::open(&path) {
                Ok(f) => f.sync_all()?,
                // Collected before it was ever published: nothing to make durable.
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e),
            }
            if let Some(parent) = path.parent() {
                dirs.insert(parent.to_path_buf());
            }
            Ok::<(), io::Error>(())
        });
        let synced = synced.and_then(|()| {
            dirs.insert(self.dir.clone());
            dirs.iter().try_for_each(|d| File::open(d)?.sync_all())
        });
        if let Err(e) = synced {
            // Put them back: the next publish tries again.
            lock(&self.unsynced).extend(pending);
            return Err(e);
        }
        Ok(())
    }
}

/// Starts writing the file's pages to disk without waiting: the publish's fsync then finds
/// them written, or on their way, rather than starting the whole upload's writeback at the end
/// (the disk works while the rest of the blocks arrive). Advice only: a failure is the fsync's
/// to report.
fn start_writeback(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a call on a descriptor `f` keeps open for its duration; no memory is passed.
    let r = unsafe { libc::sync_file_range(f.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    if r != 0 {
        tracing::trace!(error = %io::Error::last_os_error(), "sync_file_range");
    }
}

/// Alignment of memory, offsets and lengths that O_DIRECT asks for (a page covers every
/// logical block size in use).
const DIRECT_ALIGN: usize = 4096;

thread_local! {
    /// A page-aligned copy of a block that did not arrive page-aligned; kept per blocking
    /// thread so that its pages are touched once.
    static ALIGNED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Writes a cache's block past the page cache. Falls back to a buffered write where the file
/// system refuses O_DIRECT (tmpfs, some overlays).
fn write_direct(path: &Path, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let buffered = || File::create(path).and_then(|f| super::pieces::write_all(f, data));
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path);
    let mut f = match opened {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return buffered(),
        Err(e) => return Err(e),
    };
    let written = if (data.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) {
        f.write_all(data)
    } else {
        ALIGNED.with(|b| {
            let mut b = b.borrow_mut();
            b.clear();
            b.reserve(data.len() + DIRECT_ALIGN);
            let pad = b.as_ptr().align_offset(DIRECT_ALIGN);
            b.resize(pad, 0);
            b.extend_from_slice(data);
            f.write_all(&b[pad..])
        })
    };
    match written {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => buffered(),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_written_whole_and_found_by_hash() {
        let dir = tempfile::tempdir().unwrap();
        let files = BlockFiles::open(dir.path()).unwrap();
        let data = vec![7u8; 100_000];
        let hash = BlockHash::of(&data);
        assert!(files.open_block(&hash).unwrap().is_none());
        files.write(&hash, &data).unwrap();
        files.write(&hash, &data).unwrap();
        let (f, len) = files.open_block(&hash).unwrap().unwrap();
        assert_eq!(len, data.len() as u64);
        assert_eq!(std::io::read_to_string(f).unwrap().len(), data.len());
        files.sync().unwrap();
        assert!(files.unsynced.lock().unwrap().is_empty());

        // A write a crash cut short leaves only a temporary file, removed on the next open.
        let tmp = files
            .path(&hash)
            .with_file_name(format!("{}.tmp9", hash.hex()));
        std::fs::write(&tmp, b"half").unwrap();
        let files = BlockFiles::open(dir.path()).unwrap();
        assert!(!tmp.exists());
        assert!(files.exists(&hash));
    }

    fn in_memory(dir: &Path) -> bool {
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string and an out-pointer to a zeroed statfs.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statfs(c.as_ptr(), &mut st) }, 0);
        st.f_type as i64 == TMPFS_MAGIC
    }

    /// Pages of `path` in the page cache.
    fn resident_pages(path: &Path) -> usize {
        let f = File::open(path).unwrap();
        let len = f.metadata().unwrap().len() as usize;
        let pages = len.div_ceil(4096);
        let mut vec = vec![0u8; pages];
        // SAFETY: a read-only shared mapping of a file we hold open, unmapped before return;
        // mincore writes one byte per page into `vec`, which has that many.
        unsafe {
            use std::os::fd::AsRawFd;
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            assert_eq!(libc::mincore(p, len, vec.as_mut_ptr()), 0);
            libc::munmap(p, len);
        }
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn a_cache_writes_whole_pages_past_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let (files, _) = BlockFiles::open_volatile(dir.path()).unwrap();
        // Aligned as the data plane receives blocks, one not aligned, and a length that is
        // not a whole number of pages.
        let mut aligned = vec![0u8; (256 << 10) + 2 * DIRECT_ALIGN];
        let pad = aligned.as_ptr().align_offset(DIRECT_ALIGN);
        let block: Vec<u8> = (0..256u32 << 10).map(|i| (i % 253) as u8).collect();
        aligned[pad..pad + block.len()].copy_from_slice(&block);
        let cases: [(&[u8], bool); 3] = [
            (&aligned[pad..pad + block.len()], true),
            (&aligned[pad + 1..pad + 1 + block.len()], true),
            (&block[..block.len() - 100], false),
        ];
        for (data, direct) in cases {
            let h = BlockHash::of(data);
            files.write(&h, data).unwrap();
            assert_eq!(files.read(&h).unwrap().unwrap(), data);
            // Read back through the page cache just now: drop it and look at what a write
            // alone leaves there.
            files.remove(&h).unwrap();
            files.write(&h, data).unwrap();
            let resident = resident_pages(&files.path(&h));
            if in_memory(dir.path()) {
                // tmpfs: its files are page cache, and O_DIRECT falls back to buffered writes.
                continue;
            }
            if direct {
                assert_eq!(
                    resident, 0,
                    "an O_DIRECT write left pages in the page cache"
                );
            } else {
                assert!(resident > 0);
            }
        }
        // The store's blocks stay in the page cache for the getters that come next.
        let store = BlockFiles::open(&dir.path().join("store")).unwrap();
        let h = BlockHash::of(&block);
        store.write(&h, &block).unwrap();
        assert!(resident_pages(&store.path(&h)) > 0);
    }
}
