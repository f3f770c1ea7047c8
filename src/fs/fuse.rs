//! The fuser adapter: each kernel request becomes one call on [`FsCore`], its `Ok` a reply and
//! its `Err` an errno. Nothing else happens here.
//!
//! The core is async; fuser calls its callbacks on the mount's threads. A callback waits for
//! the core on its thread ([`FuseAdapter::wait`], the one place the mount blocks on the
//! runtime), except a read that has to wait for the network: that one runs as a task of the
//! runtime and replies from it (fuser's replies are `Send`), so a read stalled on a dead peer
//! holds no thread of the mount, and the reads behind it go on.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use super::attr::{Attr, Caller, Kind};
use super::error::FsError;
use super::filesystem::FsCore;
use super::handles::Handles;
use super::ops::file::ReadNow;
use super::read::file::PageCache;
use crate::gpu::control::Waker;
use crate::locks::lock;
use crate::proto::FuseInit;

pub struct FuseAdapter {
    core: Arc<FsCore>,
    rt: tokio::runtime::Handle,
    /// What the kernel offered at FUSE_INIT, kept so that a restarted agent can replay it.
    init: Arc<Mutex<Option<FuseInit>>>,
    /// Whether the kernel lets a file opened past the page cache be mmapped.
    bypass_mmap: AtomicBool,
}

impl FuseAdapter {
    pub fn new(core: Arc<FsCore>) -> Self {
        FuseAdapter {
            rt: core.runtime().clone(),
            core,
            init: Arc::default(),
            bypass_mmap: AtomicBool::new(false),
        }
    }

    fn open_flags(&self, cache: PageCache) -> FopenFlags {
        match cache {
            PageCache::Keep => FopenFlags::FOPEN_KEEP_CACHE,
            PageCache::Direct => FopenFlags::FOPEN_DIRECT_IO,
            // Without the kernel's leave to mmap such a file (Linux 6.6+), mmap would fail.
            PageCache::Bypass if self.bypass_mmap.load(Ordering::Relaxed) => {
                FopenFlags::FOPEN_DIRECT_IO
            }
            PageCache::Bypass | PageCache::Fresh => FopenFlags::empty(),
        }
    }

    /// Runs a call of the core to its end on this thread (a mount's thread, outside the runtime).
    /// `Send`, though it runs here: every call could run as a task, so none holds a lock of a
    /// thread across a wait.
    fn wait<F: std::future::Future + Send>(&self, call: F) -> F::Output {
        self.rt.block_on(call)
    }

    /// Where the kernel's FUSE_INIT offer is recorded once the session's handshake is done.
    pub fn init_record(&self) -> Arc<Mutex<Option<FuseInit>>> {
        self.init.clone()
    }
}

fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

fn caller(req: &Request) -> Caller {
    Caller {
        pid: req.pid(),
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDevice => FileType::CharDevice,
        Kind::BlockDevice => FileType::BlockDevice,
    }
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.mtime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        flags: 0,
        blksize: 1 << 20,
    }
}

fn name(n: &OsStr) -> Result<&str, Errno> {
    n.to_str().ok_or(Errno::EINVAL)
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => kernel_time(t),
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// The time the kernel sent. fuser 0.18 reads a time before 1970, `(-s, n)`, as `s` seconds
/// and `n` nanoseconds before the epoch, where the kernel means `n` nanoseconds after `-s`.
fn kernel_time(t: SystemTime) -> SystemTime {
    match std::time::UNIX_EPOCH.duration_since(t) {
        Ok(d) if d.subsec_nanos() != 0 => {
            std::time::UNIX_EPOCH - Duration::from_secs(d.as_secs())
                + Duration::from_nanos(u64::from(d.subsec_nanos()))
        }
        _ => t,
    }
}

macro_rules! reply_or {
    ($reply:ident, $e:expr, $ok:expr) => {
        match $e {
            Ok(v) => $ok(v),
            Err(e) => {
                tracing::debug!(error = %e, "fs error");
                $reply.error(errno(&e))
            }
        }
    };
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Asking for more than the kernel allows tells what it allows.
        let offered = config.set_max_readahead(u32::MAX).err().unwrap_or(u32::MAX);
        let _ = config.set_max_readahead((4 << 20).min(offered));
        let _ = config.set_max_write(1 << 20);
        let mmap = config
            .add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
            .is_ok();
        // Listings with attributes: the kernel asks for them on a directory's first read, or
        // when its names were being looked up (AUTO), plain listings otherwise.
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        self.bypass_mmap.store(mmap, Ordering::Relaxed);
        let abi = config.kernel_abi();
        *lock(&self.init) = Some(FuseInit {
            major: abi.0,
            minor: abi.1,
            max_readahead: offered,
            flags: config.capabilities().bits(),
        });
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEntry) {
        let Ok(n) = name(n) else {
            return reply.error(Errno::ENOENT);
        };
        reply_or!(
            reply,
            self.wait(self.core.lookup(parent.0, n)),
            |a: Attr| reply.entry(&self.core.kernel_ttl(a.ino), &file_attr(&a), Generation(0))
        )
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.core.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        reply_or!(
            reply,
            self.wait(self.core.getattr_open(ino.0, fh.map(|f| f.0))),
            |a: Attr| reply.attr(&self.core.kernel_ttl(a.ino), &file_attr(&a))
        )
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if let Some(t) = atime {
            self.core.set_atime(ino.0, time(t));
        }
        let r = self.wait(self.core.setattr(
            ino.0,
            mode,
            uid,
            gid,
            size,
            mtime.map(time),
            fh.map(|f| f.0),
        ));
        reply_or!(reply, r, |a: Attr| reply
            .attr(&Duration::ZERO, &file_attr(&a)))
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        reply_or!(reply, self.wait(self.core.readlink(ino.0)), |t: String| {
            reply.data(t.as_bytes())
        })
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let Ok(n) = name(n) else {
            return reply.error(Errno::EINVAL);
        };
        reply_or!(
            reply,
            self.wait(self.core.mkdir_by(parent.0, n, mode & !umask, caller(req))),
            |a: Attr| reply.entry(&self.core.kernel_ttl(a.ino), &file_attr(&a), Generation(0))
        )
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let Ok(n) = name(n) else {
            return reply.error(Errno::ENOENT);
        };
        reply_or!(reply, self.wait(self.core.unlink(parent.0, n)), |()| reply
            .ok())
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let Ok(n) = name(n) else {
            return reply.error(Errno::ENOENT);
        };
        reply_or!(reply, self.wait(self.core.rmdir(parent.0, n)), |()| reply
            .ok())
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let (Ok(n), Some(t)) = (name(link), target.to_str()) else {
            return reply.error(Errno::EINVAL);
        };
        reply_or!(
            reply,
            self.wait(self.core.symlink_by(parent.0, n, t, caller(req))),
            |a: Attr| reply.entry(&self.core.kernel_ttl(a.ino), &file_attr(&a), Generation(0))
        )
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        n: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (Ok(n), Ok(nn)) = (name(n), name(newname)) else {
            return reply.error(Errno::EINVAL);
        };
        reply_or!(
            reply,
            self.wait(self.core.rename(parent.0, n, newparent.0, nn, flags.bits())),
            |()| reply.ok()
        )
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Ok(n) = name(n) else {
            return reply.error(Errno::EINVAL);
        };
        let mode = (mode & libc::S_IFMT) | (mode & 0o7777 & !umask);
        reply_or!(
            reply,
            self.wait(self.core.mknod_by(parent.0, n, mode, rdev, caller(req))),
            |a: Attr| reply.entry(&self.core.kernel_ttl(a.ino), &file_attr(&a), Generation(0))
        )
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let Ok(n) = name(newname) else {
            return reply.error(Errno::EINVAL);
        };
        reply_or!(
            reply,
            self.wait(self.core.link(ino.0, newparent.0, n)),
            |a: Attr| { reply.entry(&self.core.kernel_ttl(a.ino), &file_attr(&a), Generation(0)) }
        )
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        reply_or!(
            reply,
            self.wait(self.core.open_by(ino.0, flags.0, req.pid())),
            |(fh, cache): (u64, PageCache)| {
                let mut flags = self.open_flags(cache);
                if !Handles::flushes(fh) {
                    flags |= FopenFlags::FOPEN_NOFLUSH;
                }
                reply.opened(FileHandle(fh), flags)
            }
        )
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // What this node holds is answered here; what must be fetched is answered by a task.
        match self.core.read_now(ino.0, fh.0, offset, size) {
            ReadNow::Ready(r) => reply_or!(reply, r, |d: bytes::Bytes| reply.data(&d)),
            ReadNow::Wait(wait) => {
                let core = self.core.clone();
                self.rt.spawn(async move {
                    let r = core.read_wait(wait).await;
                    reply_or!(reply, r, |d: bytes::Bytes| reply.data(&d))
                });
            }
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply_or!(reply, self.core.write(fh.0, offset, data), |n: u32| reply
            .written(n))
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        reply_or!(
            reply,
            self.core.fallocate(fh.0, offset, length, mode),
            |()| reply.ok()
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn copy_file_range(
        &self,
        _req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply_or!(
            reply,
            self.wait(
                self.core
                    .copy_range(ino_in.0, fh_in.0, offset_in, fh_out.0, offset_out, len)
            ),
            |n: u32| reply.written(n)
        )
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply_or!(reply, self.wait(self.core.flush(fh.0)), |()| reply.ok())
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        reply_or!(reply, self.wait(self.core.release(fh.0)), |()| reply.ok())
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply_or!(reply, self.wait(self.core.fsync(fh.0)), |()| reply.ok())
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply_or!(reply, self.wait(self.core.opendir(ino.0)), |fh: u64| reply
            .opened(FileHandle(fh), FopenFlags::empty()))
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        match self.wait(self.core.readdir(ino.0, fh.0, offset)) {
            Ok(entries) => {
                for (next, e) in entries {
                    if reply.add(INodeNo(e.ino), next, file_type(e.kind), &e.name) {
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// A listing with each name's attributes, as if each were looked up: `ls -l` and the opens
    /// after a `find` need no LOOKUP of their own (while the entries' TTL holds).
    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        match self.wait(self.core.readdir(ino.0, fh.0, offset)) {
            Ok(entries) => {
                for (next, e) in entries {
                    // A name gone since the listing was taken is left out.
                    let Ok(a) = self.wait(self.core.readdirplus_attr(ino.0, &e)) else {
                        continue;
                    };
                    let full = reply.add(
                        INodeNo(a.ino),
                        next,
                        &e.name,
                        &self.core.kernel_ttl(a.ino),
                        &file_attr(&a),
                        Generation(0),
                    );
                    if full {
                        // Not sent, so not counted by the kernel.
                        if e.name != "." && e.name != ".." {
                            self.core.forget(a.ino, 1);
                        }
                        break;
                    }
                }
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply_or!(reply, self.wait(self.core.release(fh.0)), |()| reply.ok())
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Directory changes are published when they are made; files queued below it by
        // write-back are waited for.
        reply_or!(reply, self.wait(self.core.fsyncdir(ino.0)), |()| reply.ok())
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        reply_or!(reply, self.core.statfs(), |s: libc::statvfs| reply.statfs(
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            255,
            s.f_frsize as u32
        ))
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        n: &OsStr,
        value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let Ok(n) = name(n) else {
            return reply.error(Errno::ENOTSUP);
        };
        reply_or!(
            reply,
            self.wait(self.core.setxattr(ino.0, n, value)),
            |()| reply.ok()
        )
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, n: &OsStr, size: u32, reply: ReplyXattr) {
        let Ok(n) = name(n) else {
            return reply.error(Errno::ENODATA);
        };
        reply_or!(reply, self.wait(self.core.getxattr(ino.0, n)), |v: Vec<
            u8,
        >| {
            xattr_reply(reply, size, &v)
        })
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        reply_or!(reply, self.wait(self.core.listxattr(ino.0)), |v: Vec<
            u8,
        >| {
            xattr_reply(reply, size, &v)
        })
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, n: &OsStr, reply: ReplyEmpty) {
        let Ok(n) = name(n) else {
            return reply.error(Errno::ENODATA);
        };
        reply_or!(reply, self.wait(self.core.removexattr(ino.0, n)), |()| {
            reply.ok()
        })
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply_or!(
            reply,
            self.wait(self.core.ioctl(fh.0, cmd, in_data)),
            |(result, out): (i32, Vec<u8>)| {
                // The kernel copies exactly the command's size back; more would be EIO.
                if out.len() > out_size as usize {
                    reply.error(Errno::EIO)
                } else {
                    reply.ioctl(result, &out)
                }
            }
        )
    }

    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        ph: fuser::PollNotifier,
        _events: fuser::PollEvents,
        flags: fuser::PollFlags,
        reply: fuser::ReplyPoll,
    ) {
        // The kernel asks to be told later only when the caller will wait.
        let waker: Option<Waker> = flags
            .contains(fuser::PollFlags::FUSE_POLL_SCHEDULE_NOTIFY)
            .then(|| {
                Box::new(move || {
                    if let Err(e) = ph.notify() {
                        tracing::debug!(error = %e, "poll notification refused");
                    }
                }) as Waker
            });
        reply_or!(reply, self.core.poll(fh.0, waker), |ready: bool| {
            reply.poll(if ready {
                fuser::PollEvents::POLLIN | fuser::PollEvents::POLLRDNORM
            } else {
                fuser::PollEvents::empty()
            })
        })
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Permissions are checked by the kernel (default_permissions).
        reply.ok()
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        n: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let Ok(n) = name(n) else {
            return reply.error(Errno::EINVAL);
        };
        reply_or!(
            reply,
            self.wait(
                self.core
                    .create_by(parent.0, n, mode & !umask, flags, caller(req))
            ),
            |(a, fh, cache): (Attr, u64, PageCache)| reply.created(
                &self.core.kernel_ttl(a.ino),
                &file_attr(&a),
                Generation(0),
                FileHandle(fh),
                self.open_flags(cache)
            )
        )
    }
}

fn xattr_reply(reply: ReplyXattr, size: u32, v: &[u8]) {
    if size == 0 {
        reply.size(v.len() as u32)
    } else if (size as usize) < v.len() {
        reply.error(Errno::ERANGE)
    } else {
        reply.data(v)
    }
}
