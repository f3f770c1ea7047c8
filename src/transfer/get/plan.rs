//! The destination side of a get: what to do with each entry (checked before anything is
//! written), temporary files laid out beside their destinations, and the finish that gives
//! files their metadata and their names once every block arrived and was verified.

use std::collections::HashMap;
use std::fs::{self, File, FileTimes};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ignore::gitignore::{Gitignore, GitignoreBuilder};

use super::error::{io, GetError};
use crate::dataplane::fetch::BlockJob;
use crate::manifest::{self, EntryKind, FileEntry, ManifestError};
use crate::proto::LocalFile;

/// What of a published entry's metadata a get gives back beyond its bytes, times and
/// permission bits. A manifest is another user's word: by default a get, even as root, makes
/// no device node, gives no set-user-ID or set-group-ID bit, and leaves the files to the
/// caller, as rsync does without `-D` and `-o`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Preserve {
    /// Make character and block devices (`--preserve-devices`; needs CAP_MKNOD).
    pub devices: bool,
    /// Give entries their published owner, and files their set-user-ID and set-group-ID
    /// bits (`--preserve-owner`; the owner needs root).
    pub owner: bool,
}

impl Preserve {
    /// The permission bits `e` is given.
    fn mode(self, e: &FileEntry) -> u32 {
        if self.owner {
            e.mode & 0o7777
        } else {
            e.mode & 0o1777
        }
    }

    /// The owner `e` is given, when asked for and this process may give it (root).
    fn owner(self, e: &FileEntry) -> Option<(u32, u32)> {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        match (self.owner && root, e.uid, e.gid) {
            (true, Some(uid), Some(gid)) => Some((uid, gid)),
            _ => None,
        }
    }
}

/// What to do with one manifest entry at the destination.
pub(super) enum Plan {
    Dir,
    Symlink,
    /// A fifo, socket or device node, made again where the caller may.
    Special,
    /// Already there with the same size and mtime (rsync's quick check).
    UpToDate,
    /// A device node the caller did not ask for: not made.
    Skip,
    /// Fetch into this temporary file, then rename.
    Fetch(PathBuf),
}

/// The entries of one version, each with its destination path and plan.
pub(super) struct Layout<'m> {
    pub entries: Vec<&'m FileEntry>,
    pub plans: Vec<(PathBuf, Plan)>,
    preserve: Preserve,
}

impl<'m> Layout<'m> {
    /// Checks the whole destination below `root` before writing anything: an existing entry
    /// that differs is refused unless `force`.
    pub fn plan(
        entries: Vec<&'m FileEntry>,
        root: &Path,
        force: bool,
        preserve: Preserve,
    ) -> Result<Self, GetError> {
        let mut plans = Vec::with_capacity(entries.len());
        for e in &entries {
            let path = if e.path.is_empty() {
                root.to_path_buf()
            } else {
                root.join(&e.path)
            };
            let plan = plan_entry(e, &path, force, preserve)?;
            plans.push((path, plan));
        }
        Ok(Layout {
            entries,
            plans,
            preserve,
        })
    }

    fn each(&self) -> impl DoubleEndedIterator<Item = (&'m FileEntry, &Path, &Plan)> + '_ {
        self.entries
            .iter()
            .zip(&self.plans)
            .map(|(e, (p, plan))| (*e, p.as_path(), plan))
    }

    /// Creates directories and the temporary files, and lists each unique block once with
    /// every place it goes (in the order first met).
    pub fn lay_out(&self, guard: &mut TempGuard) -> Result<Laid, GetError> {
        let mut files = Vec::new();
        let mut dests = Vec::new();
        let mut jobs: HashMap<[u8; 32], BlockJob> = HashMap::new();
        let mut order = Vec::new();
        for (e, path, plan) in self.each() {
            match plan {
                Plan::Dir => fs::create_dir_all(path).map_err(io(path))?,
                Plan::Fetch(tmp) => {
                    if let Some(parent) = tmp.parent() {
                        fs::create_dir_all(parent).map_err(io(parent))?;
                    }
                    // Closed again: a tree may hold more files than the process may open.
                    let f = File::create(tmp).map_err(io(tmp))?;
                    guard.0.push(tmp.clone());
                    f.set_len(e.size).map_err(io(tmp))?;
                    drop(f);
                    let idx = files.len();
                    let expected = e.blocks.iter().map(|b| u64::from(b.len)).sum();
                    files.push((tmp.clone(), expected));
                    dests.push(path.to_path_buf());
                    let mut off = 0u64;
                    for b in &e.blocks {
                        let h = manifest::block_hash(b)
                            .ok_or_else(|| ManifestError::BadBlock(e.path.clone()))?;
                        // One job per hash, of the first length met: `manifest::validate`
                        // refused a manifest that gives one hash two lengths.
                        jobs.entry(h.0)
                            .or_insert_with(|| {
                                order.push(h.0);
                                BlockJob {
                                    hash: h,
                                    len: b.len,
                                    targets: Vec::new(),
                                    piece: None,
                                }
                            })
                            .targets
                            .push((idx, off));
                        off += u64::from(b.len);
                    }
                }
                _ => {}
            }
        }
        let jobs = order.iter().filter_map(|h| jobs.remove(h)).collect();
        Ok(Laid { files, dests, jobs })
    }

    /// The temporary files being filled, as the agent serves them while they fill.
    pub fn receiving(&self) -> Result<Vec<LocalFile>, GetError> {
        self.each()
            .filter_map(|(e, _, plan)| match plan {
                Plan::Fetch(tmp) => Some((e, tmp)),
                _ => None,
            })
            .map(|(e, tmp)| local_file(e, tmp))
            .collect()
    }

    /// Every file the destination holds now, as the agent seeds them.
    pub fn seeded(&self) -> Result<Vec<LocalFile>, GetError> {
        self.each()
            .filter(|(_, _, plan)| matches!(plan, Plan::Fetch(_) | Plan::UpToDate))
            .map(|(e, path, _)| local_file(e, path))
            .collect()
    }

    /// Everything arrived and was verified: files get their metadata and their names,
    /// symlinks are made, and directories get their modes last and deepest first (so a
    /// read-only directory is filled before it closes).
    pub fn finish(&self, guard: &mut TempGuard) -> Result<(), GetError> {
        let keep = self.preserve;
        for (e, path, plan) in self.each() {
            match plan {
                Plan::Fetch(tmp) => {
                    finish_file(tmp, e, keep)?;
                    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
                        fs::remove_file(path).map_err(io(path))?;
                    }
                    fs::rename(tmp, path).map_err(io(path))?;
                }
                Plan::Special => place_special(path, e, keep)?,
                Plan::Symlink => {
                    place_symlink(path, &e.symlink_target)?;
                    if let Some((uid, gid)) = keep.owner(e) {
                        std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(io(path))?;
                    }
                }
                _ => {}
            }
        }
        guard.0.clear();
        for (e, path, plan) in self.each().rev() {
            if let Plan::Dir = plan {
                if let Some((uid, gid)) = keep.owner(e) {
                    std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(io(path))?;
                }
                fs::set_permissions(path, fs::Permissions::from_mode(keep.mode(e)))
                    .map_err(io(path))?;
            }
        }
        Ok(())
    }
}

/// The temporary files and the blocks that fill them.
pub(super) struct Laid {
    /// Each with the bytes its blocks write into it.
    pub files: Vec<(PathBuf, u64)>,
    /// Where each of `files` lands (an older copy may be there).
    pub dests: Vec<PathBuf>,
    pub jobs: Vec<BlockJob>,
}

fn plan_entry(
    e: &FileEntry,
    path: &Path,
    force: bool,
    preserve: Preserve,
) -> Result<Plan, GetError> {
    let existing = fs::symlink_metadata(path).ok();
    let differs = || GetError::Exists(path.display().to_string());
    Ok(match e.kind() {
        EntryKind::Gpu => return Err(GetError::GpuKey(path.display().to_string())),
        EntryKind::Directory => {
            if existing.as_ref().is_some_and(|x| !x.is_dir()) && !force {
                return Err(differs());
            }
            Plan::Dir
        }
        EntryKind::Symlink => {
            if let Some(x) = &existing {
                let same = x.file_type().is_symlink()
                    && fs::read_link(path)
                        .is_ok_and(|t| t.as_os_str() == e.symlink_target.as_str());
                if !same && !force {
                    return Err(differs());
                }
            }
            Plan::Symlink
        }
        EntryKind::CharDevice | EntryKind::BlockDevice if !preserve.devices => {
            tracing::warn!(path = %path.display(), "a device node: skipped (--preserve-devices makes it)");
            Plan::Skip
        }
        EntryKind::Fifo | EntryKind::Socket | EntryKind::CharDevice | EntryKind::BlockDevice => {
            if let Some(x) = &existing {
                if !same_special(x, e) && !force {
                    return Err(differs());
                }
            }
            Plan::Special
        }
        EntryKind::File => match &existing {
            Some(x)
                if x.is_file()
                    && x.len() == e.size
                    && mtime_of(x) == (e.mtime_sec, e.mtime_nsec) =>
            {
                Plan::UpToDate
            }
            Some(x) if x.is_dir() => return Err(differs()),
            Some(_) if !force => return Err(differs()),
            _ => Plan::Fetch(temp_name(path)),
        },
    })
}

fn same_special(x: &fs::Metadata, e: &FileEntry) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let ft = x.file_type();
    let kind = match e.kind() {
        EntryKind::Fifo => ft.is_fifo(),
        EntryKind::Socket => ft.is_socket(),
        EntryKind::CharDevice => ft.is_char_device(),
        EntryKind::BlockDevice => ft.is_block_device(),
        _ => false,
    };
    kind && (x.rdev() == e.rdev
        || !matches!(e.kind(), EntryKind::CharDevice | EntryKind::BlockDevice))
}

/// Makes a fifo, socket or device node at `path`; where the caller may not (a device node
/// without CAP_MKNOD), says so and goes on, as `rsync -a` run by a user does.
fn place_special(path: &Path, e: &FileEntry, keep: Preserve) -> Result<(), GetError> {
    use std::os::unix::ffi::OsStrExt;
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(io(parent))?;
    }
    if let Ok(x) = fs::symlink_metadata(path) {
        if same_special(&x, e) {
            return Ok(());
        }
        if x.is_dir() {
            fs::remove_dir(path).map_err(io(path))?;
        } else {
            fs::remove_file(path).map_err(io(path))?;
        }
    }
    let kind = match e.kind() {
        EntryKind::Fifo => libc::S_IFIFO,
        EntryKind::Socket => libc::S_IFSOCK,
        EntryKind::CharDevice => libc::S_IFCHR,
        _ => libc::S_IFBLK,
    };
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io(path)(std::io::ErrorKind::InvalidInput.into()))?;
    // SAFETY: `c` is a valid C string; mknod reads nothing else.
    let r = unsafe { libc::mknod(c.as_ptr(), kind | keep.mode(e), e.rdev as libc::dev_t) };
    if r != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EPERM) {
            tracing::warn!(path = %path.display(), "not permitted to make this special file here: skipped");
            return Ok(());
        }
        return Err(io(path)(err));
    }
    // mknod's mode passed through the umask; the entry's is what it was.
    fs::set_permissions(path, fs::Permissions::from_mode(keep.mode(e))).map_err(io(path))?;
    if let Some((uid, gid)) = keep.owner(e) {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(io(path))?;
    }
    Ok(())
}

fn place_symlink(path: &Path, target: &str) -> Result<(), GetError> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(io(parent))?;
    }
    if fs::symlink_metadata(path).is_ok() {
        if fs::read_link(path).is_ok_and(|t| t.as_os_str() == target) {
            return Ok(());
        }
        fs::remove_file(path).map_err(io(path))?;
    }
    std::os::unix::fs::symlink(target, path).map_err(io(path))
}

fn local_file(e: &FileEntry, path: &Path) -> Result<LocalFile, GetError> {
    Ok(LocalFile {
        entry_path: e.path.clone(),
        disk_path: std::path::absolute(path)
            .map_err(io(path))?
            .display()
            .to_string(),
    })
}

fn mtime_of(m: &fs::Metadata) -> (i64, u32) {
    use std::os::unix::fs::MetadataExt;
    (m.mtime(), m.mtime_nsec() as u32)
}

fn temp_name(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.ktpart-{}", std::process::id()))
}

fn finish_file(tmp: &Path, e: &FileEntry, keep: Preserve) -> Result<(), GetError> {
    let f = File::options().write(true).open(tmp).map_err(io(tmp))?;
    if e.mtime_sec >= 0 {
        let t = UNIX_EPOCH + Duration::new(e.mtime_sec as u64, e.mtime_nsec);
        f.set_times(
            FileTimes::new()
                .set_modified(t)
                .set_accessed(SystemTime::now()),
        )
        .map_err(io(tmp))?;
    }
    // Before the mode: a chown clears the set-user-ID and set-group-ID bits.
    if let Some((uid, gid)) = keep.owner(e) {
        std::os::unix::fs::fchown(&f, Some(uid), Some(gid)).map_err(io(tmp))?;
    }
    f.set_permissions(fs::Permissions::from_mode(keep.mode(e)))
        .map_err(io(tmp))?;
    Ok(())
}

/// Removes temporary files left by a get that did not finish.
#[derive(Default)]
pub(super) struct TempGuard(Vec<PathBuf>);

impl Drop for TempGuard {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = fs::remove_file(p);
        }
    }
}

/// `--exclude`/`--include` on the paths of a manifest, rsync style.
pub(super) struct Filter {
    excludes: Gitignore,
    includes: Gitignore,
}

impl Filter {
    pub fn new(excludes: &[String], includes: &[String]) -> Result<Self, GetError> {
        let build = |pats: &[String]| {
            let mut b = GitignoreBuilder::new("/");
            for p in pats {
                b.add_line(None, p)
                    .map_err(|e| GetError::Pattern(format!("{p}: {e}")))?;
            }
            b.build().map_err(|e| GetError::Pattern(e.to_string()))
        };
        Ok(Filter {
            excludes: build(excludes)?,
            includes: build(includes)?,
        })
    }

    pub fn skips(&self, rel: &str, is_dir: bool) -> bool {
        let p = Path::new("/").join(rel);
        if self
            .includes
            .matched_path_or_any_parents(&p, is_dir)
            .is_ignore()
        {
            return false;
        }
        self.excludes
            .matched_path_or_any_parents(&p, is_dir)
            .is_ignore()
    }
}
