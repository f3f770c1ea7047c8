//! Randomised model tests of the filesystem. Generated sequences of operations (names from a
//! three-letter alphabet, at most three deep, so that they collide often) run step by step on
//! two filesystems, and after every step the result (success, the bytes read, or the errno) and
//! the whole visible tree (every directory's entries, each entry's kind, mode and size, each
//! file's bytes, each link's target) must be the same on both:
//!
//! - `the_core_matches_a_model`: `FsCore` without a mount, against an in-memory model of what
//!   a local filesystem does. The path walk the kernel would make (each component looked up,
//!   symlinks followed) and the checks the kernel makes before it asks a filesystem anything
//!   (an existing name for `mkdir`, `O_EXCL` or `symlink`; a directory opened for writing;
//!   renaming into one's own subtree) are made here, as in `kernel_*` below.
//! - `a_mount_matches_a_local_directory`: the same kind of sequences through a real mount with
//!   `std::fs`, against a directory of the machine's own filesystem: there the kernel is the
//!   reference, errnos included.
//!
//! After every step a lookup of every path the operations can name comes first (a listing
//! reads directories afresh, and would hide a stale cached one), then the walk of the tree.
//! Failures shrink to a short sequence, printed one operation a line. `PROPTEST_CASES` sets
//! the number of sequences (64 for the core and 16 for the mount by default, of at most
//! `MAX_OPS` operations each; about 3 s and 2 s).

mod common;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use ktfs::fs::names::inode::ROOT;
use ktfs::fs::{FsError, Kind};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

use common::rig::{Core as SyncCore, Rig};

type Errno = i32;

/// What an operation answered: the bytes it read (nothing for most), or its errno.
type Outcome = Result<Vec<u8>, Errno>;

const NAMES: [&str; 3] = ["a", "b", "c"];
const MAX_DEPTH: usize = 3;
/// Operations in one sequence, at most.
const MAX_OPS: usize = 60;
/// Links followed in one path walk before ELOOP, as Linux's MAXSYMLINKS.
const MAX_LINKS: usize = 40;

/// A path below the root of the test, as names.
#[derive(Clone, PartialEq, Eq)]
struct P(Vec<&'static str>);

impl fmt::Display for P {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.0.join("/"))
    }
}

/// Bytes to write: `len` letters from `first` on, so that offsets show in what is read back.
#[derive(Clone, PartialEq, Eq)]
struct Data {
    first: u8,
    len: usize,
}

impl fmt::Debug for P {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Debug for Data {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Data {
    fn bytes(&self) -> Vec<u8> {
        (0..self.len)
            .map(|i| b'a' + ((self.first as usize + i) % 26) as u8)
            .collect()
    }
}

impl fmt::Display for Data {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8(self.bytes()).unwrap())
    }
}

#[derive(Clone)]
enum Op {
    /// open(O_WRONLY | O_CREAT [| O_EXCL]), write at 0, close.
    Create {
        path: P,
        data: Data,
        excl: bool,
    },
    /// open(O_WRONLY | O_TRUNC), write, close.
    Overwrite {
        path: P,
        data: Data,
    },
    /// open(O_WRONLY), pwrite at `at`, close.
    WriteAt {
        path: P,
        at: u64,
        data: Data,
    },
    /// truncate(2).
    Truncate {
        path: P,
        len: u64,
    },
    /// open(O_RDONLY), read to the end, close.
    Read {
        path: P,
    },
    Mkdir {
        path: P,
    },
    Rmdir {
        path: P,
    },
    Unlink {
        path: P,
    },
    Rename {
        from: P,
        to: P,
    },
    Symlink {
        path: P,
        target: P,
    },
    Readlink {
        path: P,
    },
    Chmod {
        path: P,
        mode: u32,
    },
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Op::Create { path, data, excl } => {
                let x = if *excl { "_excl" } else { "" };
                write!(f, "create{x} {path} {data}")
            }
            Op::Overwrite { path, data } => write!(f, "overwrite {path} {data}"),
            Op::WriteAt { path, at, data } => write!(f, "write {path} @{at} {data}"),
            Op::Truncate { path, len } => write!(f, "truncate {path} {len}"),
            Op::Read { path } => write!(f, "read {path}"),
            Op::Mkdir { path } => write!(f, "mkdir {path}"),
            Op::Rmdir { path } => write!(f, "rmdir {path}"),
            Op::Unlink { path } => write!(f, "unlink {path}"),
            Op::Rename { from, to } => write!(f, "rename {from} {to}"),
            Op::Symlink { path, target } => write!(f, "symlink {path} -> {target}"),
            Op::Readlink { path } => write!(f, "readlink {path}"),
            Op::Chmod { path, mode } => write!(f, "chmod {path} {mode:o}"),
        }
    }
}

fn name_s() -> impl Strategy<Value = &'static str> {
    prop::sample::select(&NAMES[..])
}

/// Shallow paths more often than deep ones, so that most operations meet something.
fn path_s() -> impl Strategy<Value = P> {
    prop_oneof![
        5 => prop::collection::vec(name_s(), 1),
        4 => prop::collection::vec(name_s(), 2),
        1 => prop::collection::vec(name_s(), MAX_DEPTH),
    ]
    .prop_map(P)
}

fn data_s() -> impl Strategy<Value = Data> {
    (0u8..26, 0usize..=12).prop_map(|(first, len)| Data { first, len })
}

fn op_s() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (path_s(), data_s(), any::<bool>())
            .prop_map(|(path, data, excl)| Op::Create { path, data, excl }),
        1 => (path_s(), data_s()).prop_map(|(path, data)| Op::Overwrite { path, data }),
        2 => (path_s(), 0u64..20, data_s())
            .prop_map(|(path, at, data)| Op::WriteAt { path, at, data }),
        1 => (path_s(), 0u64..24).prop_map(|(path, len)| Op::Truncate { path, len }),
        2 => path_s().prop_map(|path| Op::Read { path }),
        5 => path_s().prop_map(|path| Op::Mkdir { path }),
        1 => path_s().prop_map(|path| Op::Rmdir { path }),
        2 => path_s().prop_map(|path| Op::Unlink { path }),
        4 => (path_s(), path_s()).prop_map(|(from, to)| Op::Rename { from, to }),
        // Relative targets without `..`: a link resolves inside the tree wherever it is moved.
        1 => (path_s(), prop::collection::vec(name_s(), 1..=2))
            .prop_map(|(path, t)| Op::Symlink { path, target: P(t) }),
        1 => path_s().prop_map(|path| Op::Readlink { path }),
        1 => (path_s(), prop::sample::select(&[0o600u32, 0o640, 0o644, 0o700, 0o755][..]))
            .prop_map(|(path, mode)| Op::Chmod { path, mode }),
    ]
}

fn ops_s() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op_s(), 1..=MAX_OPS)
}

/// What the tree shows at one path.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    File { mode: u32, data: String },
    Dir { mode: u32 },
    Symlink { target: String },
}

type Tree = BTreeMap<String, Seen>;

/// A filesystem the operations run on.
trait Fs {
    fn name(&self) -> &'static str;
    fn apply(&mut self, op: &Op) -> Outcome;
    /// The whole visible tree, or what was inconsistent in it (an entry listed that cannot be
    /// looked up, a size that is not the length of what is read...).
    fn tree(&mut self) -> Result<Tree, String>;
    /// What a lookup of `p` shows, name by name from the root, no link followed and nothing
    /// listed first: kind, mode and size (a directory's size is not compared), or nothing.
    fn look(&mut self, p: &[&str]) -> Result<Option<Looked>, Errno>;
}

/// What a lookup shows.
type Looked = (Kind, u32, u64);

/// Every path the operations can name.
fn all_paths() -> Vec<Vec<&'static str>> {
    let mut out: Vec<Vec<&'static str>> = vec![vec![]];
    let mut level: Vec<Vec<&'static str>> = vec![vec![]];
    for _ in 0..MAX_DEPTH {
        level = level
            .iter()
            .flat_map(|p| NAMES.iter().map(move |n| [p.clone(), vec![*n]].concat()))
            .collect();
        out.extend(level.iter().cloned());
    }
    out.remove(0);
    out
}

fn shown(data: &[u8]) -> String {
    String::from_utf8_lossy(data).replace('\0', "_")
}

fn outcome_str(o: &Outcome, op: &Op) -> String {
    match o {
        Ok(d) if matches!(op, Op::Read { .. } | Op::Readlink { .. }) => {
            format!("ok {:?}", shown(d))
        }
        Ok(_) => "ok".into(),
        Err(e) => errno_name(*e),
    }
}

fn errno_name(e: Errno) -> String {
    let known = [
        (libc::ENOENT, "ENOENT"),
        (libc::EEXIST, "EEXIST"),
        (libc::ENOTDIR, "ENOTDIR"),
        (libc::EISDIR, "EISDIR"),
        (libc::ENOTEMPTY, "ENOTEMPTY"),
        (libc::EINVAL, "EINVAL"),
        (libc::ELOOP, "ELOOP"),
        (libc::EIO, "EIO"),
        (libc::EPERM, "EPERM"),
        (libc::ESTALE, "ESTALE"),
        (libc::EBADF, "EBADF"),
    ];
    known
        .iter()
        .find(|(n, _)| *n == e)
        .map_or_else(|| format!("errno {e}"), |(_, s)| s.to_string())
}

/// Runs `ops` on both filesystems, comparing after every step.
fn compare(ops: &[Op], a: &mut dyn Fs, b: &mut dyn Fs) -> Result<(), TestCaseError> {
    for (i, op) in ops.iter().enumerate() {
        let (ra, rb) = (a.apply(op), b.apply(op));
        if ra != rb {
            return Err(TestCaseError::fail(format!(
                "step {i}, {op:?}: {} answered {}, {} answered {}",
                a.name(),
                outcome_str(&ra, op),
                b.name(),
                outcome_str(&rb, op)
            )));
        }
        // Lookups first: a listing reads every directory afresh, and would hide a stale one.
        for p in all_paths() {
            let (la, lb) = (a.look(&p), b.look(&p));
            if la != lb {
                return Err(TestCaseError::fail(format!(
                    "step {i}, {op:?}: a lookup of {}: {} shows {la:?}, {} shows {lb:?}",
                    p.join("/"),
                    a.name(),
                    b.name()
                )));
            }
        }
        let (ta, tb) = (a.tree(), b.tree());
        let (ta, tb) = match (ta, tb) {
            (Ok(ta), Ok(tb)) => (ta, tb),
            (ta, tb) => {
                return Err(TestCaseError::fail(format!(
                    "step {i}, {op:?}: a tree could not be read: {}: {:?}; {}: {:?}",
                    a.name(),
                    ta.err(),
                    b.name(),
                    tb.err()
                )))
            }
        };
        if ta != tb {
            let mut diff = String::new();
            for k in ta.keys().chain(tb.keys().filter(|k| !ta.contains_key(*k))) {
                let (x, y) = (ta.get(k), tb.get(k));
                if x != y {
                    diff += &format!("\n  {k}: {} {x:?}, {} {y:?}", a.name(), b.name());
                }
            }
            return Err(TestCaseError::fail(format!(
                "step {i}, {op:?}: the trees differ:{diff}"
            )));
        }
    }
    Ok(())
}

/// Runs `cases` generated sequences through `case`; a failure panics with the shortest
/// sequence it shrank to, one operation a line.
fn run_cases(default_cases: u32, case: impl Fn(&[Op]) -> Result<(), TestCaseError>) {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(default_cases);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        // Each shrink step is a whole run against real servers: enough to get short, no more.
        max_shrink_iters: 512,
        ..Config::default()
    });
    let r = runner.run(&ops_s(), |ops| case(&ops));
    match r {
        Ok(()) => {}
        Err(TestError::Fail(why, ops)) => {
            let seq: String = ops
                .iter()
                .enumerate()
                .map(|(i, op)| format!("\n  {i}: {op:?}"))
                .collect();
            panic!("{why}\nminimal sequence:{seq}");
        }
        Err(e) => panic!("{e}"),
    }
}

// The path walk, for the core (as the kernel walks) and the model alike.

type Canon = Vec<String>;

/// What a walk needs of a filesystem: what is at a path (no links in it but maybe the last
/// component), and a link's target.
trait Walk {
    fn kind_at(&mut self, p: &[String]) -> Result<Option<Kind>, Errno>;
    fn target_at(&mut self, p: &[String]) -> Result<String, Errno>;
}

/// Resolves `path` as the kernel's path walk does: each component but the last must be a
/// directory (a link to one followed), and the last is followed if `follow`. Returns the
/// path with no link in it and what is there (nothing: a name that does not exist, in a
/// directory that does).
fn resolve(w: &mut dyn Walk, path: &[&str], follow: bool) -> Result<(Canon, Option<Kind>), Errno> {
    let mut cur: Canon = Vec::new();
    let mut rest: VecDeque<String> = path.iter().map(|s| s.to_string()).collect();
    let mut links = 0;
    while let Some(name) = rest.pop_front() {
        let last = rest.is_empty();
        let mut p = cur.clone();
        p.push(name);
        let kind = w.kind_at(&p)?;
        match kind {
            Some(Kind::Symlink) if !last || follow => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(libc::ELOOP);
                }
                let target = w.target_at(&p)?;
                for c in target.rsplit('/').filter(|c| !c.is_empty()) {
                    rest.push_front(c.to_string());
                }
                continue;
            }
            _ if last => return Ok((p, kind)),
            Some(Kind::Dir) => cur = p,
            None => return Err(libc::ENOENT),
            Some(_) => return Err(libc::ENOTDIR),
        }
    }
    Ok((cur, Some(Kind::Dir)))
}

/// The directory that holds `path`'s last name (links followed), and that name.
fn resolve_parent(w: &mut dyn Walk, path: &[&str]) -> Result<(Canon, String), Errno> {
    let (name, dir) = path.split_last().expect("a path has a name");
    let canon = if dir.is_empty() {
        Vec::new()
    } else {
        match resolve(w, dir, true)? {
            (c, Some(Kind::Dir)) => c,
            (_, None) => return Err(libc::ENOENT),
            _ => return Err(libc::ENOTDIR),
        }
    };
    Ok((canon, name.to_string()))
}

/// The kernel's own checks of a rename, made before a filesystem is asked (`do_renameat2`):
/// the same name is nothing to do; a directory cannot move into itself (EINVAL) nor onto one
/// of its ancestors (ENOTEMPTY). `None`: the filesystem decides.
fn kernel_rename_check(from: &[String], to: &[String]) -> Option<Outcome> {
    if from == to {
        Some(Ok(Vec::new()))
    } else if to.starts_with(from) {
        Some(Err(libc::EINVAL))
    } else if from.starts_with(to) {
        Some(Err(libc::ENOTEMPTY))
    } else {
        None
    }
}

// The model.

#[derive(Clone, Debug)]
enum Node {
    File { data: Vec<u8>, mode: u32 },
    Dir { mode: u32 },
    Symlink { target: String },
}

#[derive(Default)]
struct Model {
    nodes: BTreeMap<Canon, Node>,
}

impl Walk for Model {
    fn kind_at(&mut self, p: &[String]) -> Result<Option<Kind>, Errno> {
        Ok(self.nodes.get(p).map(|n| match n {
            Node::File { .. } => Kind::File,
            Node::Dir { .. } => Kind::Dir,
            Node::Symlink { .. } => Kind::Symlink,
        }))
    }

    fn target_at(&mut self, p: &[String]) -> Result<String, Errno> {
        match self.nodes.get(p) {
            Some(Node::Symlink { target }) => Ok(target.clone()),
            _ => Err(libc::EINVAL),
        }
    }
}

impl Model {
    fn children(&self, dir: &[String]) -> impl Iterator<Item = &Canon> + '_ {
        let dir = dir.to_vec();
        self.nodes
            .keys()
            .filter(move |k| k.len() == dir.len() + 1 && k.starts_with(&dir))
    }

    /// The file at `path` (followed), for writing or reading.
    fn file(&mut self, path: &P) -> Result<&mut Vec<u8>, Errno> {
        let (canon, _) = resolve(self, &path.0, true)?;
        match self.nodes.get_mut(&canon) {
            Some(Node::File { data, .. }) => Ok(data),
            Some(Node::Dir { .. }) => Err(libc::EISDIR),
            Some(Node::Symlink { .. }) => unreachable!("followed"),
            None => Err(libc::ENOENT),
        }
    }

    fn write_at(data: &mut Vec<u8>, at: usize, bytes: &[u8]) {
        // Writing nothing extends nothing (and the kernel sends no write).
        if bytes.is_empty() {
            return;
        }
        if data.len() < at + bytes.len() {
            data.resize(at + bytes.len(), 0);
        }
        data[at..at + bytes.len()].copy_from_slice(bytes);
    }

    fn run(&mut self, op: &Op) -> Outcome {
        match op {
            Op::Create { path, data, excl } => {
                let (canon, kind) = resolve(self, &path.0, !excl)?;
                match kind {
                    Some(_) if *excl => Err(libc::EEXIST),
                    Some(_) => {
                        Model::write_at(self.file(path)?, 0, &data.bytes());
                        Ok(Vec::new())
                    }
                    None => {
                        let node = Node::File {
                            data: data.bytes(),
                            mode: 0o644,
                        };
                        self.nodes.insert(canon, node);
                        Ok(Vec::new())
                    }
                }
            }
            Op::Overwrite { path, data } => {
                *self.file(path)? = data.bytes();
                Ok(Vec::new())
            }
            Op::WriteAt { path, at, data } => {
                Model::write_at(self.file(path)?, *at as usize, &data.bytes());
                Ok(Vec::new())
            }
            Op::Truncate { path, len } => {
                self.file(path)?.resize(*len as usize, 0);
                Ok(Vec::new())
            }
            Op::Read { path } => Ok(self.file(path)?.clone()),
            Op::Mkdir { path } => match resolve(self, &path.0, false)? {
                (_, Some(_)) => Err(libc::EEXIST),
                (canon, None) => {
                    self.nodes.insert(canon, Node::Dir { mode: 0o755 });
                    Ok(Vec::new())
                }
            },
            Op::Rmdir { path } => match resolve(self, &path.0, false)? {
                (_, None) => Err(libc::ENOENT),
                (canon, Some(Kind::Dir)) => {
                    if self.children(&canon).next().is_some() {
                        return Err(libc::ENOTEMPTY);
                    }
                    self.nodes.remove(&canon);
                    Ok(Vec::new())
                }
                (_, Some(_)) => Err(libc::ENOTDIR),
            },
            Op::Unlink { path } => match resolve(self, &path.0, false)? {
                (_, None) => Err(libc::ENOENT),
                (_, Some(Kind::Dir)) => Err(libc::EISDIR),
                (canon, Some(_)) => {
                    self.nodes.remove(&canon);
                    Ok(Vec::new())
                }
            },
            Op::Rename { from, to } => {
                let (fdir, fname) = resolve_parent(self, &from.0)?;
                let (tdir, tname) = resolve_parent(self, &to.0)?;
                let src = [fdir, vec![fname]].concat();
                let dst = [tdir, vec![tname]].concat();
                let Some(skind) = self.kind_at(&src)? else {
                    return Err(libc::ENOENT);
                };
                if let Some(o) = kernel_rename_check(&src, &dst) {
                    return o;
                }
                match (skind == Kind::Dir, self.kind_at(&dst)?) {
                    (_, None) => {}
                    (true, Some(Kind::Dir)) => {
                        if self.children(&dst).next().is_some() {
                            return Err(libc::ENOTEMPTY);
                        }
                    }
                    (true, Some(_)) => return Err(libc::ENOTDIR),
                    (false, Some(Kind::Dir)) => return Err(libc::EISDIR),
                    (false, Some(_)) => {}
                }
                self.nodes.remove(&dst);
                let moved: Vec<Canon> = self
                    .nodes
                    .keys()
                    .filter(|k| k.starts_with(&src))
                    .cloned()
                    .collect();
                for k in moved {
                    let n = self.nodes.remove(&k).unwrap();
                    let nk = [dst.clone(), k[src.len()..].to_vec()].concat();
                    self.nodes.insert(nk, n);
                }
                Ok(Vec::new())
            }
            Op::Symlink { path, target } => match resolve(self, &path.0, false)? {
                (_, Some(_)) => Err(libc::EEXIST),
                (canon, None) => {
                    let target = target.to_string();
                    self.nodes.insert(canon, Node::Symlink { target });
                    Ok(Vec::new())
                }
            },
            Op::Readlink { path } => match resolve(self, &path.0, false)? {
                (_, None) => Err(libc::ENOENT),
                (canon, Some(Kind::Symlink)) => Ok(self.target_at(&canon)?.into_bytes()),
                _ => Err(libc::EINVAL),
            },
            Op::Chmod { path, mode } => {
                let (canon, _) = resolve(self, &path.0, true)?;
                match self.nodes.get_mut(&canon) {
                    Some(Node::File { mode: m, .. } | Node::Dir { mode: m }) => *m = *mode,
                    Some(Node::Symlink { .. }) => unreachable!("followed"),
                    None => return Err(libc::ENOENT),
                }
                Ok(Vec::new())
            }
        }
    }
}

impl Fs for Model {
    fn name(&self) -> &'static str {
        "the model"
    }

    fn look(&mut self, p: &[&str]) -> Result<Option<Looked>, Errno> {
        let mut cur: Canon = Vec::new();
        for name in p {
            if !cur.is_empty() && !matches!(self.nodes.get(&cur), Some(Node::Dir { .. })) {
                return Ok(None);
            }
            cur.push(name.to_string());
        }
        Ok(self.nodes.get(&cur).map(|n| match n {
            Node::File { data, mode } => (Kind::File, *mode, data.len() as u64),
            Node::Dir { mode } => (Kind::Dir, *mode, 0),
            Node::Symlink { target } => (Kind::Symlink, 0o777, target.len() as u64),
        }))
    }

    fn apply(&mut self, op: &Op) -> Outcome {
        self.run(op)
    }

    fn tree(&mut self) -> Result<Tree, String> {
        Ok(self
            .nodes
            .iter()
            .map(|(k, n)| {
                let seen = match n {
                    Node::File { data, mode } => Seen::File {
                        mode: *mode,
                        data: shown(data),
                    },
                    Node::Dir { mode } => Seen::Dir { mode: *mode },
                    Node::Symlink { target } => Seen::Symlink {
                        target: target.clone(),
                    },
                };
                (k.join("/"), seen)
            })
            .collect())
    }
}

// The core, called as the FUSE adapter calls it, behind the kernel's walk and checks.

struct Core<'a> {
    core: &'a SyncCore,
    clock: &'a ktfs::clock::ManualClock,
}

fn errno(e: FsError) -> Errno {
    e.errno()
}

impl Walk for Core<'_> {
    fn kind_at(&mut self, p: &[String]) -> Result<Option<Kind>, Errno> {
        Ok(self.attr_at(p)?.map(|a| a.kind))
    }

    fn target_at(&mut self, p: &[String]) -> Result<String, Errno> {
        let a = self.attr_at(p)?.ok_or(libc::ENOENT)?;
        self.core.readlink(a.ino).map_err(errno)
    }
}

impl Core<'_> {
    /// Looks `p` up from the root, name by name, as the kernel does.
    fn attr_at(&self, p: &[String]) -> Result<Option<ktfs::fs::Attr>, Errno> {
        let mut attr = self.core.getattr(ROOT).map_err(errno)?;
        for name in p {
            match self.core.lookup(attr.ino, name) {
                Ok(a) => attr = a,
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) => return Err(errno(e)),
            }
        }
        Ok(Some(attr))
    }

    fn ino_at(&self, p: &[String]) -> Result<u64, Errno> {
        Ok(self.attr_at(p)?.ok_or(libc::ENOENT)?.ino)
    }

    /// The kernel's open of an existing file: a directory is not opened for writing
    /// (`may_open`), a link was followed by the walk.
    fn kernel_open(&self, path: &P, flags: i32) -> Result<(u64, u64), Errno> {
        let (canon, kind) = resolve(
            &mut Core {
                core: self.core,
                clock: self.clock,
            },
            &path.0,
            true,
        )?;
        match kind {
            None => Err(libc::ENOENT),
            Some(Kind::Dir) => Err(libc::EISDIR),
            Some(_) => {
                let ino = self.ino_at(&canon)?;
                let (fh, _) = self.core.open(ino, flags).map_err(errno)?;
                Ok((ino, fh))
            }
        }
    }

    /// Writes and closes, as close(2) does: FLUSH (which publishes), then RELEASE.
    fn write_close(&self, fh: u64, at: u64, data: &[u8]) -> Outcome {
        let w = if data.is_empty() {
            Ok(())
        } else {
            match self.core.write(fh, at, data) {
                Ok(n) if n as usize == data.len() => Ok(()),
                Ok(_) => Err(libc::EIO),
                Err(e) => Err(errno(e)),
            }
        };
        let f = self.core.flush(fh).map_err(errno);
        let r = self.core.release(fh).map_err(errno);
        w.and(f).and(r).map(|()| Vec::new())
    }

    fn read_all(&self, ino: u64, fh: u64) -> Outcome {
        let mut out = Vec::new();
        let r = loop {
            match self.core.read(ino, fh, out.len() as u64, 1 << 16) {
                Ok(c) if c.is_empty() => break Ok(()),
                Ok(c) => out.extend_from_slice(&c),
                Err(e) => break Err(errno(e)),
            }
        };
        let rel = self.core.release(fh).map_err(errno);
        r.and(rel).map(|()| out)
    }

    fn run(&mut self, op: &Op) -> Outcome {
        let core = self.core;
        match op {
            Op::Create { path, data, excl } => {
                let (canon, kind) = resolve(self, &path.0, !excl)?;
                match kind {
                    // The kernel found the name: O_EXCL fails, anything else is an open.
                    Some(_) if *excl => Err(libc::EEXIST),
                    Some(_) => {
                        let (_, fh) = self.kernel_open(path, libc::O_WRONLY)?;
                        self.write_close(fh, 0, &data.bytes())
                    }
                    None => {
                        let (name, dir) = canon.split_last().unwrap();
                        let parent = self.ino_at(dir)?;
                        let flags = libc::O_WRONLY | libc::O_CREAT | excl_flag(*excl);
                        let (_, fh) = core.create(parent, name, 0o644, flags).map_err(errno)?;
                        self.write_close(fh, 0, &data.bytes())
                    }
                }
            }
            Op::Overwrite { path, data } => {
                let (_, fh) = self.kernel_open(path, libc::O_WRONLY | libc::O_TRUNC)?;
                self.write_close(fh, 0, &data.bytes())
            }
            Op::WriteAt { path, at, data } => {
                let (_, fh) = self.kernel_open(path, libc::O_WRONLY)?;
                self.write_close(fh, *at, &data.bytes())
            }
            Op::Truncate { path, len } => {
                let (canon, kind) = resolve(self, &path.0, true)?;
                match kind {
                    None => Err(libc::ENOENT),
                    Some(Kind::Dir) => Err(libc::EISDIR),
                    Some(_) => {
                        let ino = self.ino_at(&canon)?;
                        core.setattr(ino, None, None, None, Some(*len), None, None)
                            .map_err(errno)?;
                        Ok(Vec::new())
                    }
                }
            }
            Op::Read { path } => {
                let (ino, fh) = self.kernel_open(path, libc::O_RDONLY)?;
                self.read_all(ino, fh)
            }
            Op::Mkdir { path } => match resolve(self, &path.0, false)? {
                // The kernel's lookup found the name.
                (_, Some(_)) => Err(libc::EEXIST),
                (canon, None) => {
                    let (name, dir) = canon.split_last().unwrap();
                    let parent = self.ino_at(dir)?;
                    core.mkdir(parent, name, 0o755).map_err(errno)?;
                    Ok(Vec::new())
                }
            },
            Op::Rmdir { path } | Op::Unlink { path } => {
                let (dir, name) = resolve_parent(self, &path.0)?;
                let parent = self.ino_at(&dir)?;
                let r = if matches!(op, Op::Rmdir { .. }) {
                    core.rmdir(parent, &name)
                } else {
                    core.unlink(parent, &name)
                };
                r.map_err(errno)?;
                Ok(Vec::new())
            }
            Op::Rename { from, to } => {
                let (fdir, fname) = resolve_parent(self, &from.0)?;
                let (tdir, tname) = resolve_parent(self, &to.0)?;
                let (fparent, tparent) = (self.ino_at(&fdir)?, self.ino_at(&tdir)?);
                let src = [fdir, vec![fname.clone()]].concat();
                let dst = [tdir, vec![tname.clone()]].concat();
                // The kernel looks the source up first.
                if self.kind_at(&src)?.is_none() {
                    return Err(libc::ENOENT);
                }
                if let Some(o) = kernel_rename_check(&src, &dst) {
                    return o;
                }
                core.rename(fparent, &fname, tparent, &tname, 0)
                    .map_err(errno)?;
                Ok(Vec::new())
            }
            Op::Symlink { path, target } => match resolve(self, &path.0, false)? {
                (_, Some(_)) => Err(libc::EEXIST),
                (canon, None) => {
                    let (name, dir) = canon.split_last().unwrap();
                    let parent = self.ino_at(dir)?;
                    core.symlink(parent, name, &target.to_string())
                        .map_err(errno)?;
                    Ok(Vec::new())
                }
            },
            Op::Readlink { path } => match resolve(self, &path.0, false)? {
                (_, None) => Err(libc::ENOENT),
                (canon, Some(Kind::Symlink)) => Ok(self.target_at(&canon)?.into_bytes()),
                // The kernel: only a link has a target.
                _ => Err(libc::EINVAL),
            },
            Op::Chmod { path, mode } => {
                let (canon, kind) = resolve(self, &path.0, true)?;
                let Some(kind) = kind else {
                    return Err(libc::ENOENT);
                };
                // The kernel sends the file's type bits with the new permissions.
                let ty = if kind == Kind::Dir {
                    libc::S_IFDIR
                } else {
                    libc::S_IFREG
                };
                let ino = self.ino_at(&canon)?;
                core.setattr(ino, Some(ty | mode), None, None, None, None, None)
                    .map_err(errno)?;
                Ok(Vec::new())
            }
        }
    }

    /// Every entry below directory `ino` (at `path`), into `out`.
    fn walk(&self, ino: u64, path: &str, out: &mut Tree) -> Result<(), String> {
        let fh = self
            .core
            .opendir(ino)
            .map_err(|e| format!("opendir {path}: {e}"))?;
        let entries = self.core.readdir(ino, fh, 0);
        self.core.release(fh).map_err(|e| e.to_string())?;
        let entries = entries.map_err(|e| format!("readdir {path}: {e}"))?;
        for (_, e) in entries {
            if e.name == "." || e.name == ".." {
                continue;
            }
            let p = join_path(path, &e.name);
            let a = self
                .core
                .lookup(ino, &e.name)
                .map_err(|err| format!("{p} is listed but its lookup fails: {err}"))?;
            if a.kind != e.kind {
                return Err(format!(
                    "{p} is listed as {:?}, looked up as {:?}",
                    e.kind, a.kind
                ));
            }
            let seen = match a.kind {
                Kind::File => {
                    let (fh, _) = self
                        .core
                        .open(a.ino, libc::O_RDONLY)
                        .map_err(|err| format!("open {p}: {err}"))?;
                    let data = self
                        .read_all(a.ino, fh)
                        .map_err(|err| format!("read {p}: {}", errno_name(err)))?;
                    if a.size != data.len() as u64 {
                        return Err(format!(
                            "{p}: size {} but {} bytes read",
                            a.size,
                            data.len()
                        ));
                    }
                    Seen::File {
                        mode: u32::from(a.perm),
                        data: shown(&data),
                    }
                }
                Kind::Dir => {
                    self.walk(a.ino, &p, out)?;
                    Seen::Dir {
                        mode: u32::from(a.perm),
                    }
                }
                Kind::Symlink => {
                    let target = self
                        .core
                        .readlink(a.ino)
                        .map_err(|err| format!("readlink {p}: {err}"))?;
                    if a.size != target.len() as u64 {
                        return Err(format!("{p}: size {} for target {target:?}", a.size));
                    }
                    Seen::Symlink { target }
                }
                other => return Err(format!("{p} is a {other:?}, which no operation makes")),
            };
            out.insert(p, seen);
        }
        Ok(())
    }
}

fn excl_flag(excl: bool) -> i32 {
    if excl {
        libc::O_EXCL
    } else {
        0
    }
}

fn join_path(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

impl Fs for Core<'_> {
    fn name(&self) -> &'static str {
        "the core"
    }

    fn look(&mut self, p: &[&str]) -> Result<Option<Looked>, Errno> {
        let mut attr = self.core.getattr(ROOT).map_err(errno)?;
        for name in p {
            // The kernel looks up nothing below a name that is not a directory.
            if attr.kind != Kind::Dir {
                return Ok(None);
            }
            match self.core.lookup(attr.ino, name) {
                Ok(a) => attr = a,
                Err(e) if e.is_not_found() => return Ok(None),
                Err(e) => return Err(errno(e)),
            }
        }
        let size = if attr.kind == Kind::Dir { 0 } else { attr.size };
        Ok(Some((attr.kind, u32::from(attr.perm), size)))
    }

    fn apply(&mut self, op: &Op) -> Outcome {
        self.run(op)
    }

    fn tree(&mut self) -> Result<Tree, String> {
        let mut out = Tree::new();
        self.walk(ROOT, "", &mut out)?;
        Ok(out)
    }
}

#[test]
fn the_core_matches_a_model() {
    let rig = Rig::new();
    // Each case (and each step of shrinking) in a namespace of its own: an empty root.
    let n = AtomicUsize::new(0);
    run_cases(64, |ops| {
        let ns = format!("model-{}", n.fetch_add(1, Ordering::Relaxed));
        let core = rig.core_in(&ns, false);
        let mut core = Core {
            core: &core,
            clock: &rig.clock,
        };
        compare(ops, &mut core, &mut Model::default())
    });
}

// Through a mount, against a local directory.

/// A directory, operated on with `std::fs` as any program would.
struct Local {
    name: &'static str,
    root: PathBuf,
}

fn io_errno(e: std::io::Error) -> Errno {
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn cpath(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

/// close(2), whose errors (a failed publish) `File`'s drop would ignore.
fn close(f: std::fs::File) -> Outcome {
    use std::os::fd::IntoRawFd;
    // SAFETY: the descriptor is ours and closed once.
    if unsafe { libc::close(f.into_raw_fd()) } == 0 {
        Ok(Vec::new())
    } else {
        Err(io_errno(std::io::Error::last_os_error()))
    }
}

impl Local {
    fn at(&self, p: &P) -> PathBuf {
        self.root.join(p.to_string())
    }

    fn run(&self, op: &Op) -> Outcome {
        use std::fs::OpenOptions;
        match op {
            Op::Create { path, data, excl } => {
                let mut o = OpenOptions::new();
                o.write(true);
                if *excl {
                    o.create_new(true);
                } else {
                    o.create(true);
                }
                let f = o.open(self.at(path)).map_err(io_errno)?;
                f.write_all_at(&data.bytes(), 0).map_err(io_errno)?;
                close(f)
            }
            Op::Overwrite { path, data } => {
                let f = OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(self.at(path))
                    .map_err(io_errno)?;
                f.write_all_at(&data.bytes(), 0).map_err(io_errno)?;
                close(f)
            }
            Op::WriteAt { path, at, data } => {
                let f = OpenOptions::new()
                    .write(true)
                    .open(self.at(path))
                    .map_err(io_errno)?;
                f.write_all_at(&data.bytes(), *at).map_err(io_errno)?;
                close(f)
            }
            Op::Truncate { path, len } => {
                // SAFETY: a valid C string.
                if unsafe { libc::truncate(cpath(&self.at(path)).as_ptr(), *len as i64) } == 0 {
                    Ok(Vec::new())
                } else {
                    Err(io_errno(std::io::Error::last_os_error()))
                }
            }
            Op::Read { path } => std::fs::read(self.at(path)).map_err(io_errno),
            Op::Mkdir { path } => {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .mode(0o755)
                    .create(self.at(path))
                    .map(|()| Vec::new())
                    .map_err(io_errno)
            }
            Op::Rmdir { path } => std::fs::remove_dir(self.at(path))
                .map(|()| Vec::new())
                .map_err(io_errno),
            Op::Unlink { path } => std::fs::remove_file(self.at(path))
                .map(|()| Vec::new())
                .map_err(io_errno),
            Op::Rename { from, to } => std::fs::rename(self.at(from), self.at(to))
                .map(|()| Vec::new())
                .map_err(io_errno),
            Op::Symlink { path, target } => {
                std::os::unix::fs::symlink(target.to_string(), self.at(path))
                    .map(|()| Vec::new())
                    .map_err(io_errno)
            }
            Op::Readlink { path } => std::fs::read_link(self.at(path))
                .map(|t| t.into_os_string().into_encoded_bytes())
                .map_err(io_errno),
            Op::Chmod { path, mode } => {
                std::fs::set_permissions(self.at(path), std::fs::Permissions::from_mode(*mode))
                    .map(|()| Vec::new())
                    .map_err(io_errno)
            }
        }
    }

    fn walk(&self, dir: &Path, out: &mut Tree) -> Result<(), String> {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| format!("read_dir {}: {e}", dir.display()))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("read_dir {}: {e}", dir.display()))?;
        names.sort();
        for name in names {
            let full = dir.join(&name);
            let rel = full.strip_prefix(&self.root).unwrap().display().to_string();
            let m = std::fs::symlink_metadata(&full).map_err(|e| format!("stat {rel}: {e}"))?;
            let mode = m.permissions().mode() & 0o7777;
            let seen = if m.file_type().is_symlink() {
                let target = std::fs::read_link(&full).map_err(|e| format!("{rel}: {e}"))?;
                let target = target.display().to_string();
                if m.len() != target.len() as u64 {
                    return Err(format!("{rel}: size {} for target {target:?}", m.len()));
                }
                Seen::Symlink { target }
            } else if m.is_dir() {
                self.walk(&full, out)?;
                Seen::Dir { mode }
            } else {
                let data = std::fs::read(&full).map_err(|e| format!("read {rel}: {e}"))?;
                if m.len() != data.len() as u64 {
                    return Err(format!(
                        "{rel}: size {} but {} bytes read",
                        m.len(),
                        data.len()
                    ));
                }
                Seen::File {
                    mode,
                    data: shown(&data),
                }
            };
            out.insert(rel, seen);
        }
        Ok(())
    }
}

impl Fs for Local {
    fn name(&self) -> &'static str {
        self.name
    }

    fn look(&mut self, p: &[&str]) -> Result<Option<Looked>, Errno> {
        let mut cur = self.root.clone();
        let mut m = None;
        for name in p {
            if m.as_ref().is_some_and(|m: &std::fs::Metadata| !m.is_dir()) {
                return Ok(None);
            }
            cur.push(name);
            match std::fs::symlink_metadata(&cur) {
                Ok(x) => m = Some(x),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(io_errno(e)),
            }
        }
        let m = m.expect("a path has a name");
        let kind = if m.file_type().is_symlink() {
            Kind::Symlink
        } else if m.is_dir() {
            Kind::Dir
        } else {
            Kind::File
        };
        let size = if kind == Kind::Dir { 0 } else { m.len() };
        Ok(Some((kind, m.permissions().mode() & 0o7777, size)))
    }

    fn apply(&mut self, op: &Op) -> Outcome {
        self.run(op)
    }

    fn tree(&mut self) -> Result<Tree, String> {
        let mut out = Tree::new();
        self.walk(&self.root.clone(), &mut out)?;
        Ok(out)
    }
}

#[test]
fn a_mount_matches_a_local_directory() {
    const IP: &str = "127.0.0.180";
    // Both sides create with the same mask.
    // SAFETY: umask only sets the process's file mode mask.
    unsafe { libc::umask(0o022) };
    let c = common::Cluster::new(IP);
    let m = common::start_mount(IP, &c.server.addr, &c.path("m"), "model", &[]);
    let reference = tempfile::tempdir().unwrap();
    let n = AtomicUsize::new(0);
    run_cases(16, |ops| {
        let case = format!("case-{}", n.fetch_add(1, Ordering::Relaxed));
        let (on_mount, local) = (m.path(&case), reference.path().join(&case));
        std::fs::create_dir(&on_mount).unwrap();
        std::fs::create_dir(&local).unwrap();
        compare(
            ops,
            &mut Local {
                name: "the mount",
                root: on_mount,
            },
            &mut Local {
                name: "the local directory",
                root: local,
            },
        )
    });
}
