//! The least a FUSE filesystem can do for `cp -r`: names and sizes in memory, bytes dropped.
//! bench/fuse.sh times a `cp -r` into it beside the one into a mount: the ceiling of any FUSE
//! create path on the machine. `nullfs MOUNTPOINT` (8 threads; `NT=n` for others).
//!
//! It also lists its directories and reads its files back (zeros of each file's size), so a
//! `cat *` of a copied tree costs the kernel's requests for it and nothing else: the ceiling of
//! a first read of many small files (bench/smallfiles.sh). Its listings carry attributes, as a
//! mount's do, so the kernel looks up no name it listed: a read costs an open, a read and a
//! release, as on a mount.
//!
//! It gets the requests a ktfs mount gets for each created file (seven): mounted with
//! `default_permissions`, so a create in a directory makes the kernel fetch the directory's
//! attributes again before the next, and answering `getxattr` (no attribute), so the kernel asks
//! for `security.capability` before a new file's first write. (Answering `ENOSYS` would stop
//! the kernel asking at all, which a mount that keeps extended attributes cannot do.)
//!
//! `NULLFS_NO_OPEN=1` answers `open` and `flush` with `ENOSYS`: the kernel then sends neither
//! again for the mount's life, nor any `release` (its no-open mode), so a read of a small file
//! costs its read alone: what a filesystem that keeps no state per open file could reach.
use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, ReplyXattr, Request,
    WriteFlags,
};

const TTL: Duration = Duration::from_secs(1);

struct Null {
    no_open: bool,
    names: Mutex<HashMap<(u64, String), u64>>,
    attrs: Mutex<HashMap<u64, FileAttr>>,
    next: Mutex<u64>,
}

fn attr(ino: u64, kind: FileType, size: u64) -> FileAttr {
    let now = SystemTime::now();
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm: if kind == FileType::Directory {
            0o755
        } else {
            0o644
        },
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        flags: 0,
        blksize: 4096,
    }
}

impl Null {
    fn add(&self, parent: u64, name: &OsStr, kind: FileType) -> FileAttr {
        let mut next = self.next.lock().unwrap();
        *next += 1;
        let a = attr(*next, kind, 0);
        self.names
            .lock()
            .unwrap()
            .insert((parent, name.to_string_lossy().into()), *next);
        self.attrs.lock().unwrap().insert(*next, a);
        a
    }
}

impl Null {
    /// The entries of directory `dir`, in the order they were made.
    fn children(&self, dir: u64) -> Vec<(u64, String)> {
        let mut entries: Vec<(u64, String)> = self
            .names
            .lock()
            .unwrap()
            .iter()
            .filter(|((parent, _), _)| *parent == dir)
            .map(|((_, name), child)| (*child, name.clone()))
            .collect();
        entries.sort();
        entries
    }
}

impl Filesystem for Null {
    fn lookup(&self, _r: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        let ino = self
            .names
            .lock()
            .unwrap()
            .get(&(parent.0, n.to_string_lossy().into()))
            .copied();
        match ino.and_then(|i| self.attrs.lock().unwrap().get(&i).copied()) {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }
    fn getattr(&self, _r: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attrs.lock().unwrap().get(&ino.0).copied() {
            Some(a) => reply.attr(&TTL, &a),
            None if ino.0 == 1 => reply.attr(&TTL, &attr(1, FileType::Directory, 0)),
            None => reply.error(Errno::ENOENT),
        }
    }
    fn mkdir(&self, _r: &Request, parent: INodeNo, n: &OsStr, _m: u32, _u: u32, reply: ReplyEntry) {
        reply.entry(
            &TTL,
            &self.add(parent.0, n, FileType::Directory),
            Generation(0),
        )
    }
    fn create(
        &self,
        _r: &Request,
        parent: INodeNo,
        n: &OsStr,
        _m: u32,
        _u: u32,
        _f: i32,
        reply: ReplyCreate,
    ) {
        let a = self.add(parent.0, n, FileType::RegularFile);
        reply.created(
            &TTL,
            &a,
            Generation(0),
            FileHandle(a.ino.0),
            FopenFlags::empty(),
        )
    }
    fn write(
        &self,
        _r: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _w: WriteFlags,
        _f: OpenFlags,
        _l: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if let Some(a) = self.attrs.lock().unwrap().get_mut(&ino.0) {
            a.size = a.size.max(offset + data.len() as u64);
        }
        reply.written(data.len() as u32)
    }
    fn read(
        &self,
        _r: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _f: OpenFlags,
        _l: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let len = self.attrs.lock().unwrap().get(&ino.0).map_or(0, |a| a.size);
        let n = len.saturating_sub(offset).min(u64::from(size)) as usize;
        reply.data(&vec![0u8; n])
    }
    fn init(&mut self, _r: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        Ok(())
    }
    fn readdirplus(
        &self,
        _r: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries = self.children(ino.0);
        let attrs = self.attrs.lock().unwrap();
        for (i, (child, name)) in entries.iter().enumerate().skip(offset as usize) {
            let Some(a) = attrs.get(child) else { continue };
            if reply.add(INodeNo(*child), i as u64 + 1, name, &TTL, a, Generation(0)) {
                break;
            }
        }
        reply.ok()
    }
    fn readdir(
        &self,
        _r: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = self.children(ino.0);
        let attrs = self.attrs.lock().unwrap();
        for (i, (child, name)) in entries.iter().enumerate().skip(offset as usize) {
            let kind = attrs.get(child).map_or(FileType::RegularFile, |a| a.kind);
            if reply.add(INodeNo(*child), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok()
    }
    fn getxattr(&self, _r: &Request, _i: INodeNo, _n: &OsStr, _s: u32, reply: ReplyXattr) {
        reply.error(Errno::ENODATA)
    }
    fn open(&self, _r: &Request, _i: INodeNo, _f: OpenFlags, reply: ReplyOpen) {
        match self.no_open {
            true => reply.error(Errno::ENOSYS),
            false => reply.opened(FileHandle(0), FopenFlags::empty()),
        }
    }
    fn flush(&self, _r: &Request, _i: INodeNo, _fh: FileHandle, _l: LockOwner, reply: ReplyEmpty) {
        match self.no_open {
            true => reply.error(Errno::ENOSYS),
            false => reply.ok(),
        }
    }
    fn release(
        &self,
        _r: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _f: OpenFlags,
        _l: Option<LockOwner>,
        _fl: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok()
    }
}

fn main() {
    let mnt = std::env::args().nth(1).expect("mountpoint");
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("null".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    // As many threads as a mount has.
    config.n_threads = Some(
        std::env::var("NT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8),
    );
    let fs = Null {
        no_open: std::env::var_os("NULLFS_NO_OPEN").is_some(),
        names: Mutex::default(),
        attrs: Mutex::default(),
        next: Mutex::new(1),
    };
    let session = fuser::Session::new(fs, std::path::Path::new(&mnt), &config).expect("mount");
    session.run().expect("run");
}
