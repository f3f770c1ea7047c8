//! Building a manifest from files on local disk: what `kt put` publishes.
//!
//! Directory semantics follow rsync: `--src dir` publishes `dir` itself under the key, while
//! `--src dir/` or `--contents` publishes what is inside it. A single file source makes the key
//! name that file (with `--contents`, a directory holding the file by its name, as the data store
//! ktfs replaces does). `--exclude`/`--include` are rsync filter patterns (gitignore syntax: `*.log`
//! matches at any depth, `/build` only at the top, `cache/` only directories); `.gitignore`
//! files in the tree are honoured, and an `--include` overrides both.

use std::fs::{self, File};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::Match;

use super::chunk::{hash_blocks_with, Chunking};
use super::index::{self, Known, Nothing};
use crate::manifest::{BlockRef, EntryKind, FileEntry, Manifest};
use crate::proto::FileStat;

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error("source {0} does not exist")]
    Missing(String),
    #[error("no --src given")]
    NoSource,
    #[error("{0}: file name is not valid UTF-8")]
    NotUtf8(String),
    #[error("two sources publish the same path {0:?}")]
    Duplicate(String),
    #[error("bad filter pattern {0:?}: {1}")]
    Pattern(String, String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

impl ScanError {
    pub fn fault(&self) -> crate::rpc::Fault {
        use crate::rpc::Fault;
        match self {
            ScanError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => {
                Fault::NoSpace
            }
            ScanError::Io { .. } => Fault::Internal,
            _ => Fault::Invalid,
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ScanError + '_ {
    move |source| ScanError::Io {
        path: path.display().to_string(),
        source,
    }
}

#[derive(Clone, Debug, Default)]
pub struct ScanOptions {
    pub block_size: u32,
    pub contents: bool,
    pub excludes: Vec<String>,
    pub includes: Vec<String>,
}

/// A manifest and, for every file entry, the file on disk that holds its bytes.
pub struct Scanned {
    pub manifest: Manifest,
    /// `(entry path, disk path)` for each file entry, in manifest order.
    pub files: Vec<(String, PathBuf)>,
    /// Each file's identity on disk when it was scanned, in the order of `files`.
    pub stats: Vec<FileStat>,
    /// Files whose blocks were read and hashed (the rest were known).
    pub hashed: usize,
}

impl Scanned {
    /// The disk path of each file entry, looked up by entry path.
    pub fn disk_path(&self, entry: &str) -> Option<&Path> {
        self.files
            .binary_search_by(|(p, _)| p.as_str().cmp(entry))
            .ok()
            .map(|i| self.files[i].1.as_path())
    }
}

struct Filters {
    excludes: Gitignore,
    includes: Gitignore,
}

impl Filters {
    fn new(root: &Path, opts: &ScanOptions) -> Result<Self, ScanError> {
        let build = |pats: &[String]| {
            let mut b = GitignoreBuilder::new(root);
            for p in pats {
                b.add_line(None, p)
                    .map_err(|e| ScanError::Pattern(p.clone(), e.to_string()))?;
            }
            b.build()
                .map_err(|e| ScanError::Pattern(pats.join(" "), e.to_string()))
        };
        Ok(Filters {
            excludes: build(&opts.excludes)?,
            includes: build(&opts.includes)?,
        })
    }

    /// Whether `path` is left out, given the `.gitignore` matchers of its directories, innermost last.
    fn skips(&self, path: &Path, is_dir: bool, gitignores: &[Gitignore]) -> bool {
        if self.includes.matched(path, is_dir).is_ignore() {
            return false;
        }
        if self.excludes.matched(path, is_dir).is_ignore() {
            return true;
        }
        for gi in gitignores.iter().rev() {
            match gi.matched(path, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        false
    }
}

/// Scans the sources (as the user typed them: a trailing `/` means "contents") into a manifest.
pub fn scan(srcs: &[String], opts: &ScanOptions) -> Result<Scanned, ScanError> {
    scan_known(srcs, opts, &Nothing)
}

/// [`scan`], taking the blocks of files `known` knows instead of reading them.
pub fn scan_known(
    srcs: &[String],
    opts: &ScanOptions,
    known: &dyn Known,
) -> Result<Scanned, ScanError> {
    scan_streaming(srcs, opts, known, &|_, _, _, _| {})
}

/// What a scan hands over of each block it hashes: the file, the block's offset in it, its
/// reference and its bytes. Called on the hashing threads, as blocks are cut.
pub type BlockSink<'a> = dyn Fn(&Path, u64, &BlockRef, &[u8]) + Sync + 'a;

/// [`scan_known`], handing every block it hashes to `sink` as it goes (blocks `known` gave are
/// not read, so not handed over).
pub fn scan_streaming(
    srcs: &[String],
    opts: &ScanOptions,
    known: &dyn Known,
    sink: &BlockSink<'_>,
) -> Result<Scanned, ScanError> {
    if srcs.is_empty() {
        return Err(ScanError::NoSource);
    }
    let mut metas = Vec::new();
    for s in srcs {
        let path = PathBuf::from(s);
        let meta = fs::symlink_metadata(&path).map_err(|_| ScanError::Missing(s.clone()))?;
        metas.push((s, path, meta));
    }
    // Each file with its identity, from the one stat the walk made of it.
    let mut out = Walked::default();

    // One file makes the key that file; with --contents, a directory holding it by its name.
    if let [(_, path, meta)] = metas.as_slice() {
        if !meta.is_dir() && !opts.contents {
            out.entries
                .push(entry_from_meta(String::new(), path, meta)?);
            if meta.is_file() {
                out.files
                    .push((String::new(), path.clone(), index::stat_of("", meta)));
            }
            return finish(out.entries, out.files, opts.block_size, known, sink);
        }
    }

    let root_mode = metas
        .iter()
        .find(|(s, _, m)| m.is_dir() && (opts.contents || s.ends_with('/')))
        .map_or(0o755, |(_, _, m)| m.permissions().mode() & 0o7777);
    out.entries.push(FileEntry {
        path: String::new(),
        kind: EntryKind::Directory as i32,
        mode: root_mode,
        ..Default::default()
    });
    for (raw, path, meta) in &metas {
        let contents = opts.contents || raw.ends_with('/');
        let root = if meta.is_dir() && contents {
            path.clone()
        } else {
            path.parent().map(Path::to_path_buf).unwrap_or_default()
        };
        let filters = Filters::new(&root, opts)?;
        if meta.is_dir() && contents {
            walk(path, "", &filters, &mut Vec::new(), &mut out, true)?;
        } else {
            let name = utf8_name(path)?;
            if filters.skips(path, meta.is_dir(), &[]) {
                continue;
            }
            out.entries.push(entry_from_meta(name.clone(), path, meta)?);
            if meta.is_file() {
                out.files
                    .push((name.clone(), path.clone(), index::stat_of(&name, meta)));
            } else if meta.is_dir() {
                walk(path, &name, &filters, &mut Vec::new(), &mut out, true)?;
            }
        }
    }
    finish(out.entries, out.files, opts.block_size, known, sink)
}

fn utf8_name(path: &Path) -> Result<String, ScanError> {
    let name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| {
            fs::canonicalize(path)
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_os_string()))
                .unwrap_or_default()
        });
    name.into_string()
        .map_err(|_| ScanError::NotUtf8(path.display().to_string()))
}

/// The kind of a fifo, socket or device node: published as metadata alone.
fn special_kind(ft: &fs::FileType) -> Option<EntryKind> {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_fifo() {
        Some(EntryKind::Fifo)
    } else if ft.is_socket() {
        Some(EntryKind::Socket)
    } else if ft.is_char_device() {
        Some(EntryKind::CharDevice)
    } else if ft.is_block_device() {
        Some(EntryKind::BlockDevice)
    } else {
        None
    }
}

fn entry_from_meta(path: String, disk: &Path, meta: &fs::Metadata) -> Result<FileEntry, ScanError> {
    let (kind, target) = if meta.is_dir() {
        (EntryKind::Directory, String::new())
    } else if meta.file_type().is_symlink() {
        let t = fs::read_link(disk).map_err(io_err(disk))?;
        let t = t
            .into_os_string()
            .into_string()
            .map_err(|_| ScanError::NotUtf8(disk.display().to_string()))?;
        (EntryKind::Symlink, t)
    } else {
        (
            special_kind(&meta.file_type()).unwrap_or(EntryKind::File),
            String::new(),
        )
    };
    let device = matches!(kind, EntryKind::CharDevice | EntryKind::BlockDevice);
    Ok(FileEntry {
        path,
        kind: kind as i32,
        mode: meta.permissions().mode() & 0o7777,
        size: if kind == EntryKind::File {
            meta.len()
        } else {
            0
        },
        mtime_sec: meta.mtime(),
        mtime_nsec: meta.mtime_nsec().clamp(0, 999_999_999) as u32,
        blocks: Vec::new(),
        symlink_target: target,
        rdev: if device { meta.rdev() } else { 0 },
        uid: Some(meta.uid()),
        gid: Some(meta.gid()),
    })
}

/// What a walk found, in walk order (names sorted, each directory before what it holds).
#[derive(Default)]
struct Walked {
    entries: Vec<FileEntry>,
    files: Vec<(String, PathBuf, FileStat)>,
}

/// Directories of the first level walked at once, at most: a scan is mostly `stat` calls, and
/// an unchanged put is mostly its scan.
const WALKERS: usize = 4;

/// Walks `dir` (at `rel` in the manifest) into `out`. With `spread`, the entries of `dir` and
/// their subtrees are walked by a few threads (the first level of a tree only), and joined in
/// the order one thread would have made.
fn walk(
    dir: &Path,
    rel: &str,
    filters: &Filters,
    gitignores: &mut Vec<Gitignore>,
    out: &mut Walked,
    spread: bool,
) -> Result<(), ScanError> {
    let mut children: Vec<_> = fs::read_dir(dir)
        .map_err(io_err(dir))?
        .collect::<Result<_, _>>()
        .map_err(io_err(dir))?;
    children.sort_by_key(|e| e.file_name());
    // Looked for in the listing: a stat of a `.gitignore` in every directory cost as much as a
    // tenth of an unchanged put.
    let gi_path = dir.join(".gitignore");
    let pushed = if children.iter().any(|c| c.file_name() == ".gitignore") && gi_path.is_file() {
        let (gi, _) = Gitignore::new(&gi_path);
        gitignores.push(gi);
        true
    } else {
        false
    };
    // Asked at the first level only: on Linux it reads the cgroup's CPU limit from files.
    let threads = match spread {
        true => std::thread::available_parallelism().map_or(1, |n| n.get().min(WALKERS)),
        false => 1,
    };
    if threads > 1 && children.len() >= 2 * threads {
        let next = AtomicUsize::new(0);
        let slots: Vec<Mutex<Option<Result<Walked, ScanError>>>> =
            children.iter().map(|_| Mutex::new(None)).collect();
        let shared: &[Gitignore] = gitignores;
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    let mut gis = shared.to_vec();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let (Some(child), Some(slot)) = (children.get(i), slots.get(i)) else {
                            break;
                        };
                        let mut w = Walked::default();
                        let r = visit(child, rel, filters, &mut gis, &mut w).map(|()| w);
                        *crate::locks::lock(slot) = Some(r);
                    }
                });
            }
        });
        for slot in slots {
            let found = slot
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(r) = found {
                let w = r?;
                out.entries.extend(w.entries);
                out.files.extend(w.files);
            }
        }
    } else {
        for child in &children {
            visit(child, rel, filters, gitignores, out)?;
        }
    }
    if pushed {
        gitignores.pop();
    }
    Ok(())
}

/// One entry of a directory being walked, and what is below it.
fn visit(
    child: &fs::DirEntry,
    rel: &str,
    filters: &Filters,
    gitignores: &mut Vec<Gitignore>,
    out: &mut Walked,
) -> Result<(), ScanError> {
    let path = child.path();
    // Not `symlink_metadata(path)`: the entry's own stat is relative to its directory's open
    // descriptor, where a path makes the kernel look up every component again.
    let meta = child.metadata().map_err(io_err(&path))?;
    let ft = meta.file_type();
    if filters.skips(&path, ft.is_dir(), gitignores) {
        return Ok(());
    }
    let name = utf8_name(&path)?;
    let child_rel = if rel.is_empty() {
        name
    } else {
        format!("{rel}/{name}")
    };
    out.entries
        .push(entry_from_meta(child_rel.clone(), &path, &meta)?);
    if ft.is_dir() {
        walk(&path, &child_rel, filters, gitignores, out, false)?;
    } else if ft.is_file() {
        let stat = index::stat_of(&child_rel, &meta);
        out.files.push((child_rel, path, stat));
    }
    Ok(())
}

fn finish(
    mut entries: Vec<FileEntry>,
    mut files: Vec<(String, PathBuf, FileStat)>,
    block_size: u32,
    known: &dyn Known,
    sink: &BlockSink<'_>,
) -> Result<Scanned, ScanError> {
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    if let Some(w) = entries.windows(2).find(|w| w[0].path == w[1].path) {
        return Err(ScanError::Duplicate(w[0].path.clone()));
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    let chunking = Chunking::for_block_size(block_size);
    let (files, stats): (Vec<(String, PathBuf)>, Vec<FileStat>) = files
        .into_iter()
        .map(|(rel, path, st)| ((rel, path), st))
        .unzip();
    let mut blocks: Vec<Option<(u64, Vec<BlockRef>)>> = stats
        .iter()
        .map(|st| {
            // Blocks cut by another chunking (an older put with another --block-size) may be
            // longer than this manifest allows, and blocks that do not add up to the file's size
            // are not its blocks: such a file is cut again.
            known
                .blocks(st)
                .filter(|b| b.iter().all(|b| b.len <= chunking.max_block()))
                .filter(|b| b.iter().map(|b| u64::from(b.len)).sum::<u64>() == st.size)
                .map(|b| (st.size, b))
        })
        .collect();
    let unknown: Vec<usize> = (0..files.len()).filter(|&i| blocks[i].is_none()).collect();
    let to_hash: Vec<(String, PathBuf)> = unknown.iter().map(|&i| files[i].clone()).collect();
    let hashed = hash_files(&to_hash, &chunking, sink)?;
    for (i, h) in unknown.iter().zip(hashed) {
        blocks[*i] = Some(h);
    }
    let mut blocks = blocks.into_iter().flatten();
    for e in entries.iter_mut().filter(|e| e.kind() == EntryKind::File) {
        if let Some((size, b)) = blocks.next() {
            e.size = size;
            e.blocks = b;
        }
    }
    Ok(Scanned {
        manifest: Manifest {
            // Readers check every block against it: the longest block the chunker cuts.
            block_size: chunking.max_block(),
            entries,
        },
        files,
        stats,
        hashed: to_hash.len(),
    })
}

type HashResult = Result<(u64, Vec<BlockRef>), ScanError>;

/// Hashes every file in blocks, on as many threads as there are cores.
fn hash_files(
    files: &[(String, PathBuf)],
    chunking: &Chunking,
    sink: &BlockSink<'_>,
) -> Result<Vec<(u64, Vec<BlockRef>)>, ScanError> {
    let results: Vec<Mutex<Option<HashResult>>> = files.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(files.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                // Grown to what the largest file so far needs: many small files cost little.
                let mut buf = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((_, path)) = files.get(i) else { break };
                    let r = hash_file_with(path, chunking, &mut buf, &mut |b, at, bytes| {
                        sink(path, at, b, bytes)
                    });
                    if let Ok(mut slot) = results[i].lock() {
                        *slot = Some(r);
                    }
                }
            });
        }
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .ok()
                .flatten()
                .unwrap_or(Err(ScanError::NoSource))
        })
        .collect()
}

/// Reads a file, cuts it into blocks as `chunking` says and hashes each, in `buf` (grown to
/// [`Chunking::buffer_len`] for the file). The size is what was read, so a file that changes
/// while it is scanned is described as it was read, never as a mix of size and blocks. A file
/// read whole in one go (a small one) is left at the start of `buf`.
pub fn hash_file(
    path: &Path,
    chunking: &Chunking,
    buf: &mut Vec<u8>,
) -> Result<(u64, Vec<BlockRef>), ScanError> {
    hash_file_with(path, chunking, buf, &mut |_, _, _| {})
}

/// [`hash_file`], handing each block to `found` as it is cut.
fn hash_file_with(
    path: &Path,
    chunking: &Chunking,
    buf: &mut Vec<u8>,
    found: &mut dyn FnMut(&BlockRef, u64, &[u8]),
) -> Result<(u64, Vec<BlockRef>), ScanError> {
    let mut f = File::open(path).map_err(io_err(path))?;
    let len = f.metadata().map_err(io_err(path))?.len();
    let want = chunking.buffer_len(len);
    if buf.len() < want {
        buf.resize(want, 0);
    }
    hash_blocks_with(&mut f, chunking, buf, found).map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(s: &Scanned) -> Vec<&str> {
        s.manifest.entries.iter().map(|e| e.path.as_str()).collect()
    }

    #[test]
    fn rsync_directory_semantics_and_filters() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("model");
        fs::create_dir_all(d.join("sub/deep")).unwrap();
        fs::write(d.join("a.bin"), vec![1u8; 10]).unwrap();
        fs::write(d.join("x.log"), b"log").unwrap();
        fs::write(d.join("sub/deep/b.txt"), b"hello").unwrap();
        fs::write(d.join("sub/keep.tmp"), b"k").unwrap();
        fs::write(d.join("sub/drop.tmp"), b"d").unwrap();
        fs::write(d.join(".gitignore"), "*.tmp\n").unwrap();
        std::os::unix::fs::symlink("a.bin", d.join("link")).unwrap();
        let opts = ScanOptions {
            block_size: 4,
            excludes: vec!["*.log".into()],
            includes: vec!["keep.tmp".into()],
            ..Default::default()
        };
        let src = d.display().to_string();
        let s = scan(std::slice::from_ref(&src), &opts).unwrap();
        assert_eq!(
            paths(&s),
            [
                "",
                "model",
                "model/.gitignore",
                "model/a.bin",
                "model/link",
                "model/sub",
                "model/sub/deep",
                "model/sub/deep/b.txt",
                "model/sub/keep.tmp"
            ]
        );
        let s = scan(&[format!("{src}/")], &opts).unwrap();
        assert_eq!(paths(&s)[1..4], [".gitignore", "a.bin", "link"]);
        let a = &s.manifest.entries[2];
        assert_eq!(a.size, 10);
        assert_eq!(a.blocks.len(), 3);
        assert_eq!(a.blocks[2].len, 2);
        let link = &s.manifest.entries[3];
        assert_eq!(link.symlink_target, "a.bin");
        assert_eq!(s.disk_path("a.bin"), Some(d.join("a.bin").as_path()));
        crate::manifest::validate(&s.manifest).unwrap();

        let single = scan(&[d.join("a.bin").display().to_string()], &opts).unwrap();
        assert_eq!(paths(&single), [""]);
        assert!(matches!(
            scan(&[t.path().join("nope").display().to_string()], &opts),
            Err(ScanError::Missing(_))
        ));
    }

    /// The first level walked by several threads gives what one thread gives: the same
    /// entries in the same order, each directory's `.gitignore` applied below it only.
    #[test]
    fn a_walk_spread_over_threads_finds_what_one_thread_finds_in_its_order() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("tree");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(".gitignore"), "*.o\n").unwrap();
        for i in 0..13 {
            let sub = d.join(format!("d{i:02}/inner"));
            fs::create_dir_all(&sub).unwrap();
            fs::write(sub.join("a.rs"), b"a").unwrap();
            fs::write(sub.join("b.o"), b"b").unwrap();
            fs::write(d.join(format!("f{i:02}")), b"f").unwrap();
        }
        fs::write(d.join("d03/.gitignore"), "a.rs\n").unwrap();
        let opts = ScanOptions::default();
        let filters = Filters::new(t.path(), &opts).unwrap();
        let walked = |spread: bool| {
            let mut out = Walked::default();
            walk(&d, "tree", &filters, &mut Vec::new(), &mut out, spread).unwrap();
            let paths: Vec<String> = out.entries.iter().map(|e| e.path.clone()).collect();
            let files: Vec<String> = out.files.iter().map(|f| f.0.clone()).collect();
            (paths, files)
        };
        let (one, one_files) = walked(false);
        let (spread, spread_files) = walked(true);
        assert_eq!(spread, one);
        assert_eq!(spread_files, one_files);
        assert!(one.contains(&"tree/d02/inner/a.rs".to_string()));
        assert!(!one.contains(&"tree/d03/inner/a.rs".to_string()));
        assert!(!one.iter().any(|p| p.ends_with(".o")));
        // 1 .gitignore, 13 dirs with an inner dir, 12 a.rs, 13 f, and d03's .gitignore.
        assert_eq!(one.len(), 1 + 26 + 12 + 13 + 1);
    }

    /// Every block a scan hashes reaches the sink once, with its file and offset, as the
    /// manifest records it; a file the index knows is not read, so not handed over.
    #[test]
    fn a_streaming_scan_hands_over_each_hashed_block_with_its_offset() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("src");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("a.bin"), b"0123456789").unwrap();
        std::fs::write(d.join("b.bin"), b"abcdef").unwrap();
        let opts = ScanOptions {
            block_size: 4,
            ..Default::default()
        };
        let seen = Mutex::new(Vec::new());
        let s = scan_streaming(
            &[format!("{}/", d.display())],
            &opts,
            &Nothing,
            &|p, at, r, bytes| {
                assert_eq!(bytes.len() as u32, r.len);
                assert_eq!(blake3::hash(bytes).as_bytes()[..], r.hash[..]);
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                seen.lock().unwrap().push((name, at, bytes.to_vec()));
            },
        )
        .unwrap();
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        let want: Vec<(String, u64, Vec<u8>)> = [
            ("a.bin", 0, &b"0123"[..]),
            ("a.bin", 4, b"4567"),
            ("a.bin", 8, b"89"),
            ("b.bin", 0, b"abcd"),
            ("b.bin", 4, b"ef"),
        ]
        .iter()
        .map(|(n, at, b)| (n.to_string(), *at, b.to_vec()))
        .collect();
        assert_eq!(seen, want);
        let blocks: usize = s.manifest.entries.iter().map(|e| e.blocks.len()).sum();
        assert_eq!(blocks, 5);
    }
}
