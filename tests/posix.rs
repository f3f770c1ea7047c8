//! POSIX semantics of a real mount, as a local filesystem has them: name limits, files
//! unlinked while open, directory link counts, fallocate and copy_file_range. These tests need
//! /dev/fuse and root; they never skip themselves.

mod common;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;

fn errno_of<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

fn open_fd(path: &Path, flags: i32, mode: u32) -> OwnedFd {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; the descriptor is owned from here on.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    assert!(
        fd >= 0,
        "open {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn fstat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a stat to fill.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

fn pwrite(fd: &OwnedFd, data: &[u8], at: i64) {
    // SAFETY: a valid buffer of its length.
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), at) };
    assert_eq!(
        n as usize,
        data.len(),
        "{}",
        std::io::Error::last_os_error()
    );
}

fn pread(fd: &OwnedFd, len: usize, at: i64) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    // SAFETY: a valid buffer of its length.
    let n = unsafe { libc::pread(fd.as_raw_fd(), buf.as_mut_ptr().cast(), len, at) };
    assert!(n >= 0, "{}", std::io::Error::last_os_error());
    buf.truncate(n as usize);
    buf
}

#[test]
fn a_name_longer_than_255_bytes_is_too_long_for_every_call() {
    let c = Cluster::new("127.0.0.170");
    let a = start_mount("127.0.0.170", &c.server.addr, &c.path("a"), "px-a", &[]);
    let long = "n".repeat(256);
    let ok = "n".repeat(255);
    let too_long = Some(libc::ENAMETOOLONG);
    assert_eq!(errno_of(std::fs::metadata(a.path(&long))), too_long);
    assert_eq!(errno_of(std::fs::File::create(a.path(&long))), too_long);
    assert_eq!(errno_of(std::fs::create_dir(a.path(&long))), too_long);
    assert_eq!(errno_of(std::fs::remove_file(a.path(&long))), too_long);
    assert_eq!(errno_of(std::fs::remove_dir(a.path(&long))), too_long);
    assert_eq!(
        errno_of(std::os::unix::fs::symlink("x", a.path(&long))),
        too_long
    );
    std::fs::write(a.path(&ok), b"255 bytes is a name").unwrap();
    assert_eq!(
        errno_of(std::fs::rename(a.path(&ok), a.path(&long))),
        too_long
    );
    assert_eq!(std::fs::read(a.path(&ok)).unwrap(), b"255 bytes is a name");
    // Below a directory too.
    std::fs::create_dir(a.path("d")).unwrap();
    assert_eq!(
        errno_of(std::fs::metadata(a.path(&format!("d/{long}")))),
        too_long
    );
}

#[test]
fn a_file_unlinked_while_open_keeps_reading_and_writing_until_closed() {
    let c = Cluster::new("127.0.0.171");
    let a = start_mount("127.0.0.171", &c.server.addr, &c.path("a"), "px-b", &[]);
    // Open for writing, unlinked, written on: the descriptor holds the file.
    let w = open_fd(&a.path("w"), libc::O_CREAT | libc::O_RDWR, 0o644);
    pwrite(&w, b"before ", 0);
    std::fs::remove_file(a.path("w")).unwrap();
    assert!(!a.path("w").exists());
    pwrite(&w, b"after", 7);
    assert_eq!(pread(&w, 100, 0), b"before after");
    let st = fstat(&w).unwrap();
    assert_eq!((st.st_size, st.st_nlink), (12, 0));
    drop(w);
    // Closing it published nothing.
    assert!(!a.path("w").exists());
    assert_eq!(c.kt(None, &["ls", "w"]).status.code(), Some(3));

    // Published, opened for reading, unlinked: still read in full.
    let data = pseudo_random(3 << 20, 7);
    std::fs::write(a.path("r"), &data).unwrap();
    let r = open_fd(&a.path("r"), libc::O_RDONLY, 0);
    std::fs::remove_file(a.path("r")).unwrap();
    let st = fstat(&r).unwrap();
    assert_eq!((st.st_size as usize, st.st_nlink), (data.len(), 0));
    assert!(
        pread(&r, data.len(), 0) == data,
        "the unlinked file read back otherwise"
    );
}

fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    let cstr = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let (a, b) = (cstr(a), cstr(b));
    // SAFETY: two NUL-terminated paths that outlive the call.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `openat` below a directory descriptor: paths here are too long to hand the kernel whole.
fn open_at(dir: &OwnedFd, name: &str, flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
    let c = CString::new(name).unwrap();
    // SAFETY: a valid descriptor and C string; the new descriptor is owned from here on.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Walks (and with `make`, makes where missing) `segs` below `root`, one name per call.
fn walk_at(root: &Path, segs: &[String], make: bool) -> std::io::Result<OwnedFd> {
    let mut dir = open_fd(root, libc::O_DIRECTORY | libc::O_RDONLY, 0);
    for seg in segs {
        if make {
            let c = CString::new(seg.as_str()).unwrap();
            // SAFETY: a valid descriptor and C string.
            if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) } < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(e);
                }
            }
        }
        dir = open_at(&dir, seg, libc::O_DIRECTORY | libc::O_RDONLY, 0)?;
    }
    Ok(dir)
}

#[test]
fn a_file_deeper_than_path_max_below_the_mount_is_made_read_and_renamed_on_every_node() {
    // The kernel bounds each path one call is handed (PATH_MAX), not how deep a file lies: a
    // program that works relative to a directory reaches past 4096 bytes from the root, as
    // pjdfstest's */03.t do.
    let c = Cluster::new("127.0.0.166");
    let a = start_mount("127.0.0.166", &c.server.addr, &c.path("a"), "px-d", &[]);
    let b = start_mount("127.0.0.184", &c.server.addr, &c.path("b"), "px-e", &[]);
    let segs: Vec<String> = (0..20)
        .map(|i| format!("{i:02}{}", "d".repeat(248)))
        .collect();
    assert!(segs.iter().map(|s| s.len() + 1).sum::<usize>() > 4096 + 500);
    let deep = walk_at(&a.mountpoint, &segs, true).unwrap();
    let f = open_at(&deep, "f", libc::O_CREAT | libc::O_RDWR, 0o644).unwrap();
    pwrite(&f, b"deep down", 0);
    drop(f);
    let c_old = CString::new("f").unwrap();
    let c_new = CString::new("g").unwrap();
    // SAFETY: a valid descriptor and C strings.
    let r = unsafe {
        libc::renameat(
            deep.as_raw_fd(),
            c_old.as_ptr(),
            deep.as_raw_fd(),
            c_new.as_ptr(),
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let g = open_at(&deep, "g", libc::O_RDONLY, 0).unwrap();
    assert_eq!(pread(&g, 64, 0), b"deep down");
    // Another node walks the same tree and reads the same bytes.
    assert!(eventually(std::time::Duration::from_secs(5), || {
        walk_at(&b.mountpoint, &segs, false)
            .and_then(|d| open_at(&d, "g", libc::O_RDONLY, 0))
            .is_ok_and(|g| pread(&g, 64, 0) == b"deep down")
    }));
    // Past the key's own bound (16 KiB from the root) a name is too long, as a local
    // filesystem's would be past its limit, and nothing is made.
    let more: Vec<String> = (20..70)
        .map(|i| format!("{i:02}{}", "d".repeat(248)))
        .collect();
    let err = walk_at(&a.mountpoint, &[segs.clone(), more].concat(), true).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENAMETOOLONG));
}

#[test]
fn rename_exchange_swaps_two_names_in_one_change_seen_by_every_node() {
    let c = Cluster::new("127.0.0.164");
    let a = start_mount("127.0.0.164", &c.server.addr, &c.path("a"), "px-x", &[]);
    let b = start_mount("127.0.0.165", &c.server.addr, &c.path("b"), "px-y", &[]);
    std::fs::write(a.path("x"), b"a file").unwrap();
    std::fs::create_dir_all(a.path("y/sub")).unwrap();
    std::fs::write(a.path("y/sub/inner"), b"inside").unwrap();
    let (x_ino, y_ino) = (lstat(&a.path("x")).st_ino, lstat(&a.path("y")).st_ino);
    // A file and a directory trade places, each whole, each keeping its inode.
    exchange(&a.path("x"), &a.path("y")).unwrap();
    assert_eq!(std::fs::read(a.path("y")).unwrap(), b"a file");
    assert_eq!(std::fs::read(a.path("x/sub/inner")).unwrap(), b"inside");
    assert_eq!(
        (lstat(&a.path("y")).st_ino, lstat(&a.path("x")).st_ino),
        (x_ino, y_ino)
    );
    assert!(eventually(std::time::Duration::from_secs(5), || {
        std::fs::read(b.path("y")).is_ok_and(|d| d == b"a file")
            && std::fs::read(b.path("x/sub/inner")).is_ok_and(|d| d == b"inside")
    }));
    // A file still being written carries its bytes to its new name.
    let w = open_fd(&a.path("w"), libc::O_CREAT | libc::O_RDWR, 0o644);
    pwrite(&w, b"staged", 0);
    exchange(&a.path("w"), &a.path("y")).unwrap();
    pwrite(&w, b" and more", 6);
    drop(w);
    assert_eq!(std::fs::read(a.path("y")).unwrap(), b"staged and more");
    assert_eq!(std::fs::read(a.path("w")).unwrap(), b"a file");
    assert!(eventually(std::time::Duration::from_secs(5), || {
        std::fs::read(b.path("y")).is_ok_and(|d| d == b"staged and more")
    }));
    // Both names must exist; a directory cannot trade places with what it holds.
    assert_eq!(
        errno_of(exchange(&a.path("w"), &a.path("nope"))),
        Some(libc::ENOENT)
    );
    assert_eq!(
        errno_of(exchange(&a.path("x"), &a.path("x/sub"))),
        Some(libc::EINVAL)
    );
}

#[test]
fn directories_count_their_subdirectories_as_links() {
    let c = Cluster::new("127.0.0.172");
    let a = start_mount("127.0.0.172", &c.server.addr, &c.path("a"), "px-c", &[]);
    let links = |p: &str| std::fs::metadata(a.path(p)).unwrap().nlink();
    std::fs::create_dir_all(a.path("p1/d/e")).unwrap();
    std::fs::create_dir(a.path("p2")).unwrap();
    std::fs::write(a.path("p1/file"), b"a file is no link").unwrap();
    assert_eq!((links("p1"), links("p1/d"), links("p2")), (3, 3, 2));
    std::fs::rename(a.path("p1/d"), a.path("p2/d")).unwrap();
    assert_eq!((links("p1"), links("p2"), links("p2/d")), (2, 3, 3));
    std::fs::remove_dir(a.path("p2/d/e")).unwrap();
    assert_eq!(links("p2/d"), 2);
}

#[test]
fn fallocate_reserves_and_copy_file_range_copies_inside_the_mount() {
    let c = Cluster::new("127.0.0.173");
    let a = start_mount("127.0.0.173", &c.server.addr, &c.path("a"), "px-d", &[]);
    let f = open_fd(&a.path("f"), libc::O_CREAT | libc::O_RDWR, 0o644);
    pwrite(&f, b"head", 0);
    // SAFETY: fallocate on a valid descriptor.
    let r =
        |mode: i32, off: i64, len: i64| unsafe { libc::fallocate(f.as_raw_fd(), mode, off, len) };
    assert_eq!(r(0, 0, 1 << 20), 0, "{}", std::io::Error::last_os_error());
    assert_eq!(fstat(&f).unwrap().st_size, 1 << 20);
    assert_eq!(r(libc::FALLOC_FL_KEEP_SIZE, 0, 4 << 20), 0);
    assert_eq!(fstat(&f).unwrap().st_size, 1 << 20);
    assert_eq!(
        r(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            4096
        ),
        -1
    );
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EOPNOTSUPP)
    );
    assert_eq!(&pread(&f, 8, 0), b"head\0\0\0\0");
    drop(f);
    assert_eq!(std::fs::metadata(a.path("f")).unwrap().len(), 1 << 20);

    let data = pseudo_random((5 << 20) + 123, 8);
    std::fs::write(a.path("src"), &data).unwrap();
    let src = open_fd(&a.path("src"), libc::O_RDONLY, 0);
    let dst = open_fd(&a.path("dst"), libc::O_CREAT | libc::O_WRONLY, 0o644);
    let mut done = 0usize;
    while done < data.len() {
        // SAFETY: valid descriptors; null offsets use and move the files' positions.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                std::ptr::null_mut(),
                dst.as_raw_fd(),
                std::ptr::null_mut(),
                data.len() - done,
                0,
            )
        };
        assert!(
            n > 0,
            "copy_file_range: {}",
            std::io::Error::last_os_error()
        );
        done += n as usize;
    }
    drop((src, dst));
    assert!(std::fs::read(a.path("dst")).unwrap() == data);
}

/// Runs `script` in sh as uid 1000, gid 1000, no supplementary groups.
fn as_user(script: &str) -> std::process::Output {
    std::process::Command::new("setpriv")
        .args([
            "--reuid",
            "1000",
            "--regid",
            "1000",
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .output()
        .unwrap()
}

fn owner(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.gid())
}

#[test]
fn owners_are_their_creators_shared_by_every_node_and_changed_by_chown() {
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::new("127.0.0.174");
    let a = start_mount("127.0.0.174", &c.server.addr, &c.path("a"), "px-e", &[]);
    let b = start_mount("127.0.0.175", &c.server.addr, &c.path("b"), "px-f", &[]);
    for d in [c.path(""), c.path("a"), c.path("b")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::create_dir(a.path("pub")).unwrap();
    std::fs::set_permissions(a.path("pub"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let dir = a.path("pub");
    let out = as_user(&format!(
        "echo hi > {d}/f && mkdir {d}/d && ln -s f {d}/l && echo x > {d}/g",
        d = dir.display()
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Its creator's, on this node and on the other.
    for m in [&a, &b] {
        for name in ["pub/f", "pub/d", "pub/l"] {
            assert!(
                eventually(std::time::Duration::from_secs(5), || owner(&m.path(name))
                    == (1000, 1000)),
                "{name} on {}: {:?}",
                m.node_id,
                owner(&m.path(name))
            );
        }
    }
    // root gives it away; the other node shows it; its old owner may no longer take it back.
    std::os::unix::fs::chown(a.path("pub/f"), Some(2000), Some(3000)).unwrap();
    assert_eq!(owner(&a.path("pub/f")), (2000, 3000));
    assert!(eventually(std::time::Duration::from_secs(5), || {
        owner(&b.path("pub/f")) == (2000, 3000)
    }));
    let out = as_user(&format!("chown 1000 {}", a.path("pub/f").display()));
    assert!(
        !out.status.success(),
        "a user took a file that is not theirs"
    );
    // A rewrite keeps the owner.
    std::fs::write(a.path("pub/g"), b"root rewrote it").unwrap();
    assert_eq!(owner(&a.path("pub/g")), (1000, 1000));
    // Below a set-group-ID directory, the directory's group, and the bit on subdirectories.
    std::fs::create_dir(a.path("pub/sg")).unwrap();
    std::os::unix::fs::chown(a.path("pub/sg"), None, Some(4000)).unwrap();
    std::fs::set_permissions(a.path("pub/sg"), std::fs::Permissions::from_mode(0o2777)).unwrap();
    let out = as_user(&format!(
        "echo y > {d}/sg/h && mkdir {d}/sg/sub",
        d = dir.display()
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(owner(&a.path("pub/sg/h")), (1000, 4000));
    assert_eq!(owner(&a.path("pub/sg/sub")), (1000, 4000));
    let sub = std::fs::metadata(a.path("pub/sg/sub")).unwrap();
    assert_ne!(
        sub.mode() & 0o2000,
        0,
        "the subdirectory lost the set-group-ID bit"
    );

    // kt put keeps a source's owner; kt get, as root, gives it back when asked to (by
    // default the caller owns what it gets: tests/cli.rs).
    let src = c.path("src.txt");
    std::fs::write(&src, b"owned by someone").unwrap();
    std::os::unix::fs::chown(&src, Some(1234), Some(5678)).unwrap();
    assert!(c
        .kt(None, &["put", "owned", "--src", src.to_str().unwrap()])
        .status
        .success());
    assert!(eventually(std::time::Duration::from_secs(5), || {
        a.path("owned").exists() && owner(&a.path("owned")) == (1234, 5678)
    }));
    let dest = c.path("got.txt");
    assert!(c
        .kt(
            None,
            &[
                "get",
                "owned",
                "--dest",
                dest.to_str().unwrap(),
                "--preserve-owner"
            ]
        )
        .status
        .success());
    assert_eq!(owner(&dest), (1234, 5678));
}

fn lstat(p: &Path) -> libc::stat {
    let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a stat to fill.
    let r = unsafe { libc::lstat(c.as_ptr(), &mut st) };
    assert_eq!(
        r,
        0,
        "lstat {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    st
}

fn mtime(st: &libc::stat) -> (i64, i64) {
    (st.st_mtime, st.st_mtime_nsec)
}

fn ctime(st: &libc::stat) -> (i64, i64) {
    (st.st_ctime, st.st_ctime_nsec)
}

/// utimensat(2) at `p`, `times` as (sec, nsec) with libc's UTIME_NOW and UTIME_OMIT.
fn utimens(p: &Path, atime: (i64, i64), mtime: (i64, i64), flags: i32) -> std::io::Result<()> {
    let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    // SAFETY: a valid C string and two timespecs.
    match unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), flags) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn to_stat_time(t: std::time::SystemTime) -> (i64, i64) {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap();
    (d.as_secs() as i64, i64::from(d.subsec_nanos()))
}

/// Asserts that `op` moved the times `pick` reads from `p`'s stat forward.
fn moves(p: &Path, pick: fn(&libc::stat) -> (i64, i64), what: &str, op: impl FnOnce()) {
    let before = pick(&lstat(p));
    op();
    let after = pick(&lstat(p));
    assert!(after > before, "{what}: {before:?} -> {after:?}");
}

#[test]
fn ctime_and_directory_times_move_as_on_a_local_filesystem_and_are_shared() {
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::new("127.0.0.176");
    let a = start_mount("127.0.0.176", &c.server.addr, &c.path("a"), "px-g", &[]);
    let b = start_mount("127.0.0.177", &c.server.addr, &c.path("b"), "px-h", &[]);
    let d = a.path("d");
    moves(&a.path(""), mtime, "mkdir, the root's mtime", || {
        std::fs::create_dir(&d).unwrap()
    });
    let f = a.path("d/f");
    let (m0, c0) = (mtime(&lstat(&d)), ctime(&lstat(&d)));
    std::fs::write(&f, b"x").unwrap();
    let st = lstat(&d);
    assert!(
        mtime(&st) > m0 && ctime(&st) > c0,
        "a create left the directory's times"
    );
    // A rewrite is a change of the file, not of the directory.
    moves(&f, ctime, "a rewrite, the file's ctime", || {
        std::fs::write(&f, b"y").unwrap()
    });
    assert_eq!(
        mtime(&lstat(&d)),
        mtime(&st),
        "a rewrite moved the directory's mtime"
    );
    // A chmod or chown is a change of the file's metadata, not of its content.
    let m0 = mtime(&lstat(&f));
    moves(&f, ctime, "chmod", || {
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap()
    });
    moves(&f, ctime, "chown", || {
        std::os::unix::fs::chown(&f, Some(1000), None).unwrap()
    });
    assert_eq!(mtime(&lstat(&f)), m0, "a chmod changed the mtime");
    // A failed operation changes nothing.
    let c0 = ctime(&lstat(&f));
    let out = as_user(&format!(
        "chmod 777 {}/x 2>&1; chown 0 {}",
        d.display(),
        f.display()
    ));
    assert!(!out.status.success());
    assert_eq!(ctime(&lstat(&f)), c0, "a refused chown changed the ctime");
    let g = a.path("d/g");
    moves(&d, mtime, "rename, the directory's mtime", || {
        std::fs::rename(&f, &g).unwrap()
    });
    assert!(ctime(&lstat(&g)) > c0, "a rename left the ctime");
    moves(&d, mtime, "mkdir", || {
        std::fs::create_dir(a.path("d/s")).unwrap()
    });
    moves(&d, mtime, "symlink", || {
        std::os::unix::fs::symlink("g", a.path("d/l")).unwrap()
    });
    moves(&d, mtime, "rmdir", || {
        std::fs::remove_dir(a.path("d/s")).unwrap()
    });
    moves(&d, mtime, "unlink", || {
        std::fs::remove_file(a.path("d/l")).unwrap()
    });

    // utimensat: nanoseconds, 64-bit seconds both ways of 1970, UTIME_OMIT, and a symlink's own.
    for t in [(4_102_444_800 + 7, 123_456_789), (-86_400 * 365, 5)] {
        utimens(&g, (libc::UTIME_OMIT, libc::UTIME_OMIT), t, 0).unwrap();
        assert_eq!(mtime(&lstat(&g)), t);
    }
    utimens(&g, (1, 0), (libc::UTIME_OMIT, libc::UTIME_OMIT), 0).unwrap();
    assert_eq!(
        mtime(&lstat(&g)),
        (-86_400 * 365, 5),
        "UTIME_OMIT moved the mtime"
    );
    std::os::unix::fs::symlink("g", a.path("d/l")).unwrap();
    let link_t = (1_000_000_000, 42);
    utimens(
        &a.path("d/l"),
        (libc::UTIME_OMIT, libc::UTIME_OMIT),
        link_t,
        libc::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    assert_eq!(mtime(&lstat(&a.path("d/l"))), link_t);
    assert_eq!(
        mtime(&lstat(&g)),
        (-86_400 * 365, 5),
        "the link's target moved"
    );
    // A directory's times set by hand stay until its entries change.
    utimens(&d, (libc::UTIME_OMIT, libc::UTIME_OMIT), (86_400, 9), 0).unwrap();
    assert_eq!(mtime(&lstat(&d)), (86_400, 9));

    // atime: this node's, as relatime keeps it; never published.
    let atime = |st: &libc::stat| (st.st_atime, st.st_atime_nsec);
    utimens(&g, (1_000, 7), (libc::UTIME_OMIT, libc::UTIME_OMIT), 0).unwrap();
    assert_eq!(atime(&lstat(&g)), (1_000, 7));
    let before_read = to_stat_time(std::time::SystemTime::now());
    std::fs::read(&g).unwrap();
    let read_at = atime(&lstat(&g));
    assert!(
        read_at >= before_read,
        "a read left an atime older than the change: {read_at:?}"
    );
    std::fs::read(&g).unwrap();
    assert_eq!(
        atime(&lstat(&g)),
        read_at,
        "relatime: a second read moved the atime"
    );
    assert!(
        eventually(std::time::Duration::from_secs(5), || {
            let st = lstat(&b.path("d/g"));
            mtime(&st) == mtime(&lstat(&g)) && atime(&st) == mtime(&st)
        }),
        "the other node shows this node's atime"
    );

    // The other node shows the very same times.
    for name in ["d", "d/g", "d/l"] {
        let (here, there) = (lstat(&a.path(name)), b.path(name));
        assert!(
            eventually(std::time::Duration::from_secs(5), || {
                let st = lstat(&there);
                (mtime(&st), ctime(&st)) == (mtime(&here), ctime(&here))
            }),
            "{name} on the other node: {:?} vs {:?}",
            (mtime(&lstat(&there)), ctime(&lstat(&there))),
            (mtime(&here), ctime(&here))
        );
    }
}

/// A close publishes what was written through the mount, and changes nothing of the file: its
/// ctime and mtime stay those of its last change, on this node and the next (pjdfstest's
/// `ftruncate::unchanged_ctime_failed` closes a new file after a refused ftruncate).
#[test]
fn a_close_leaves_the_times_of_the_file_it_publishes() {
    let c = Cluster::new("127.0.0.148");
    let a = start_mount("127.0.0.148", &c.server.addr, &c.path("a"), "px-c1", &[]);
    let b = start_mount("127.0.0.149", &c.server.addr, &c.path("b"), "px-c2", &[]);
    let nap = || std::thread::sleep(std::time::Duration::from_millis(30));
    // A new file, never written: a refused ftruncate, then the close that publishes it.
    let f = a.path("new");
    let fd = open_fd(&f, libc::O_CREAT | libc::O_RDONLY, 0o644);
    let made = lstat(&f);
    nap();
    // SAFETY: a valid descriptor.
    let r = unsafe { libc::ftruncate(fd.as_raw_fd(), 123) };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EINVAL)
    );
    nap();
    drop(fd);
    let closed = lstat(&f);
    assert_eq!(
        (ctime(&closed), mtime(&closed)),
        (ctime(&made), mtime(&made)),
        "the close of an unwritten file moved its times"
    );
    // A written file: its times are the last write's, not the close's.
    let g = a.path("written");
    let fd = open_fd(&g, libc::O_CREAT | libc::O_WRONLY, 0o644);
    pwrite(&fd, b"bytes", 0);
    let written = fstat(&fd).unwrap();
    nap();
    drop(fd);
    let closed = lstat(&g);
    assert_eq!(
        (ctime(&closed), mtime(&closed)),
        (ctime(&written), mtime(&written)),
        "the close of a written file moved its times"
    );
    for (name, want) in [("new", &made), ("written", &written)] {
        let there = b.path(name);
        assert!(
            eventually(std::time::Duration::from_secs(5), || {
                let st = lstat(&there);
                (ctime(&st), mtime(&st)) == (ctime(want), mtime(want))
            }),
            "{name} on the other node: {:?} vs {:?}",
            (ctime(&lstat(&there)), mtime(&lstat(&there))),
            (ctime(want), mtime(want))
        );
    }
}

#[test]
fn other_users_meet_the_checks_a_local_filesystem_makes() {
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::new("127.0.0.178");
    let a = start_mount("127.0.0.178", &c.server.addr, &c.path("a"), "px-i", &[]);
    for d in [c.path(""), c.path("a")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mode = |p: &str, m: u32| {
        std::fs::set_permissions(a.path(p), std::fs::Permissions::from_mode(m)).unwrap()
    };
    let user = |script: String| {
        let out = as_user(&script);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    std::fs::create_dir(a.path("p")).unwrap();
    mode("p", 0o777);
    std::fs::write(a.path("p/shared"), b"root's, writable by all").unwrap();
    mode("p/shared", 0o666);
    std::fs::write(a.path("p/mine"), b"root's alone").unwrap();
    mode("p/mine", 0o644);
    let p = a.path("p");
    let p = p.display();
    // utimensat: "now" needs write permission, explicit times need ownership.
    assert!(
        user(format!("touch -c {p}/shared")).0,
        "touch of a writable file"
    );
    let (ok, err) = user(format!("touch -c -d 2001-01-01 {p}/shared"));
    assert!(
        !ok && err.contains("not permitted"),
        "explicit times: {err}"
    );
    let (ok, err) = user(format!("touch -c {p}/mine"));
    assert!(
        !ok && err.contains("denied"),
        "touch of a read-only file: {err}"
    );

    // A sticky directory: only an entry's owner (or the directory's) removes or renames it.
    std::fs::create_dir(a.path("t")).unwrap();
    mode("t", 0o1777);
    std::fs::write(a.path("t/roots"), b"x").unwrap();
    mode("t/roots", 0o666);
    let t = a.path("t");
    let t = t.display();
    assert!(
        !user(format!("rm -f {t}/roots")).0,
        "removed another's file"
    );
    assert!(
        !user(format!("mv {t}/roots {t}/moved")).0,
        "renamed another's file"
    );
    assert!(a.path("t/roots").exists());
    assert!(user(format!("echo u > {t}/users && rm {t}/users")).0);

    // A rename out of a directory the caller may not write.
    std::fs::create_dir(a.path("ro")).unwrap();
    std::fs::write(a.path("ro/f"), b"stays").unwrap();
    let (ok, err) = user(format!("mv {}/ro/f {p}/f", a.path("").display()));
    assert!(!ok && err.contains("denied"), "{err}");
    assert!(a.path("ro/f").exists() && !a.path("p/f").exists());

    // A chmod by the owner who is not in the file's group drops set-group-ID.
    let out = as_user(&format!("echo x > {p}/sg"));
    assert!(out.status.success());
    std::os::unix::fs::chown(a.path("p/sg"), None, Some(4000)).unwrap();
    assert!(user(format!("chmod 2755 {p}/sg")).0);
    assert_eq!(lstat(&a.path("p/sg")).st_mode & 0o7777, 0o755);
}

/// Python `code` (the system's python3: a user may not reach root's own) run as uid 1000 with effective gid `gid` and `gid` its only group: a user
/// whose group is not its primary one (1000) when `gid` is another.
fn as_user_in(gid: u32, code: &str) -> (bool, String) {
    let out = std::process::Command::new("setpriv")
        .args(["--reuid", "1000", "--regid", &gid.to_string()])
        .args(["--groups", &gid.to_string(), "/usr/bin/python3", "-c", code])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The cases of pjdfstest's Rust port run as a user other than root (`*::uid_gid_eq_euid_egid`,
/// `*::unchanged_ctime_failed`, `rename::write_access_required_subdir`,
/// `{ftruncate,posix_fallocate}::affected_*create_flags*`, `utimensat::{nobody,write_perm}`,
/// `chmod::clear_isgid_bit`), each as its case makes it.
#[test]
fn a_user_of_another_group_creates_and_is_refused_as_on_a_local_filesystem() {
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::new("127.0.0.20");
    let a = start_mount("127.0.0.20", &c.server.addr, &c.path("a"), "px-u", &[]);
    for d in [c.path(""), c.path("a")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    // A directory root gave the user: what it makes there is its uid's, and its effective
    // gid's (or the directory's), whatever its primary group.
    let own = a.path("own");
    std::fs::create_dir(&own).unwrap();
    std::os::unix::fs::chown(&own, Some(1000), Some(1000)).unwrap();
    let o = own.display();
    let (ok, err) = as_user_in(
        2000,
        &format!(
            "import os\nos.close(os.open('{o}/f', os.O_CREAT | os.O_WRONLY, 0o644))\n\
             os.mkdir('{o}/d')\nos.mkfifo('{o}/p')\nos.mknod('{o}/s', 0o644 | 0o140000)"
        ),
    );
    assert!(ok, "{err}");
    for name in ["f", "d", "p", "s"] {
        let (uid, gid) = owner(&own.join(name));
        assert_eq!(uid, 1000, "{name}'s owner");
        assert!(gid == 2000 || gid == 1000, "{name}'s group: {gid}");
    }

    // A file made with no permission at all is still open for what its open asked.
    let w = a.path("w");
    std::fs::create_dir(&w).unwrap();
    mode(&w, 0o777);
    let (ok, err) = as_user_in(
        1000,
        &format!(
            "import os\nfd = os.open('{}/u', os.O_CREAT | os.O_RDWR, 0)\n\
             os.ftruncate(fd, 0)\nos.posix_fallocate(fd, 0, 1)\nos.write(fd, b'x')",
            w.display()
        ),
    );
    assert!(ok, "{err}");

    // Refused calls change nothing: not the ctime of another name of the file.
    std::fs::write(a.path("victim"), b"root's").unwrap();
    std::fs::hard_link(a.path("victim"), a.path("victim-link")).unwrap();
    let c0 = ctime(&lstat(&a.path("victim-link")));
    std::thread::sleep(std::time::Duration::from_millis(20));
    let root = a.path("");
    let code = format!(
        "import os
calls = (
    lambda: os.unlink('{r}/victim'),
    lambda: os.rename('{r}/victim', '{o}/moved'),
    lambda: os.truncate('{r}/victim', 0),
)
for call in calls:
    try:
        call()
        raise SystemExit('done')
    except PermissionError:
        pass",
        r = root.display()
    );
    let (ok, err) = as_user_in(1000, &code);
    assert!(ok, "{err}");
    assert_eq!(
        ctime(&lstat(&a.path("victim-link"))),
        c0,
        "refused calls moved the ctime"
    );

    // Moving a directory to another parent needs write access to it (its ".." changes); a
    // file moves with write access to both directories alone.
    let (from, to) = (a.path("from"), a.path("to"));
    for d in [&from, &to] {
        std::fs::create_dir(d).unwrap();
        mode(d, 0o777);
    }
    std::fs::create_dir(from.join("sub")).unwrap();
    mode(&from.join("sub"), 0o700);
    std::fs::write(from.join("file"), b"root's").unwrap();
    let (f, t) = (from.display(), to.display());
    let (ok, err) = as_user_in(
        1000,
        &format!(
            "import os
try:
    os.rename('{f}/sub', '{t}/sub')
    raise SystemExit('moved')
except PermissionError:
    pass
os.rename('{f}/file', '{t}/file')"
        ),
    );
    assert!(ok, "{err}");
    assert!(to.join("file").exists() && from.join("sub").exists());

    // utimensat: explicit times need ownership, write permission or not (EPERM).
    for (name, m) in [("ro", 0o644), ("rw", 0o666)] {
        let p = a.path(name);
        std::fs::write(&p, b"x").unwrap();
        mode(&p, m);
        let (ok, err) = as_user_in(
            1000,
            &format!(
                "import os, errno
try:
    os.utime('{}', (1900000000, 1950000000))
except PermissionError as e:
    assert e.errno == errno.EPERM, e
else:
    raise SystemExit('set')",
                p.display()
            ),
        );
        assert!(ok, "{name}: {err}");
    }

    // The owner in the file's group keeps set-group-ID through chmod, and drops it.
    let sg = a.path("sg");
    std::fs::write(&sg, b"x").unwrap();
    std::os::unix::fs::chown(&sg, Some(1000), Some(1000)).unwrap();
    for m in [0o2755, 0o755] {
        let (ok, err) = as_user_in(
            1000,
            &format!("import os\nos.chmod('{}', {m})", sg.display()),
        );
        assert!(ok, "{err}");
        assert_eq!(lstat(&sg).st_mode & 0o7777, m);
    }
}

#[test]
fn special_files_are_entries_whose_io_is_the_kernels() {
    use std::io::{Read, Write};
    use std::os::unix::fs::FileTypeExt;
    let c = Cluster::new("127.0.0.179");
    let a = start_mount("127.0.0.179", &c.server.addr, &c.path("a"), "px-j", &[]);
    let b = start_mount("127.0.0.169", &c.server.addr, &c.path("b"), "px-k", &[]);
    let cstr = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // A fifo carries bytes between two processes of one node.
    // SAFETY: a valid C string.
    assert_eq!(
        unsafe { libc::mkfifo(cstr(&a.path("fifo")).as_ptr(), 0o644) },
        0
    );
    let fifo = a.path("fifo");
    let writer = std::thread::spawn(move || {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&fifo)
            .unwrap()
            .write_all(b"through the pipe")
            .unwrap()
    });
    let mut got = String::new();
    std::fs::File::open(a.path("fifo"))
        .unwrap()
        .read_to_string(&mut got)
        .unwrap();
    writer.join().unwrap();
    assert_eq!(got, "through the pipe");
    // A device node keeps its number; the mount is nodev, so it never opens.
    let null = libc::makedev(1, 3);
    // SAFETY: a valid C string.
    let r = unsafe { libc::mknod(cstr(&a.path("null")).as_ptr(), libc::S_IFCHR | 0o666, null) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(lstat(&a.path("null")).st_rdev, null);
    assert_eq!(
        errno_of(std::fs::File::open(a.path("null"))),
        Some(libc::EACCES)
    );
    // A unix socket binds inside the mount and is connected to through it.
    let listener = std::os::unix::net::UnixListener::bind(a.path("sock")).unwrap();
    let mut client = std::os::unix::net::UnixStream::connect(a.path("sock")).unwrap();
    client.write_all(b"hello").unwrap();
    let mut buf = [0u8; 5];
    listener.accept().unwrap().0.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    // Every node lists and stats them as what they are; they rename and unlink as files do.
    assert!(eventually(std::time::Duration::from_secs(5), || {
        let ft = |n: &str| std::fs::symlink_metadata(b.path(n)).map(|m| m.file_type());
        ft("fifo").is_ok_and(|t| t.is_fifo())
            && ft("sock").is_ok_and(|t| t.is_socket())
            && ft("null").is_ok_and(|t| t.is_char_device())
    }));
    assert_eq!(lstat(&b.path("null")).st_rdev, null);
    std::fs::rename(a.path("fifo"), a.path("fifo2")).unwrap();
    assert!(lstat(&a.path("fifo2")).st_mode & libc::S_IFMT == libc::S_IFIFO);
    std::fs::remove_file(a.path("fifo2")).unwrap();
    assert!(!a.path("fifo2").exists());

    // kt put takes them from a local tree; kt get makes them again (root may make the device,
    // when asked to: by default a get makes none, tests/cli.rs).
    let src = c.path("tree");
    std::fs::create_dir(&src).unwrap();
    // SAFETY: valid C strings.
    unsafe {
        assert_eq!(libc::mkfifo(cstr(&src.join("p")).as_ptr(), 0o600), 0);
        assert_eq!(
            libc::mknod(cstr(&src.join("n")).as_ptr(), libc::S_IFCHR | 0o640, null),
            0
        );
    }
    std::fs::write(src.join("f"), b"a file beside them").unwrap();
    c.ok(
        None,
        &["put", "tree", "--src", &format!("{}/", src.display())],
    );
    let dest = c.path("got");
    c.ok(
        None,
        &[
            "get",
            "tree",
            "--dest",
            dest.to_str().unwrap(),
            "--preserve-devices",
        ],
    );
    let got = |n: &str| {
        std::fs::symlink_metadata(dest.join(n)).unwrap_or_else(|e| {
            panic!(
                "{n}: {e}; got {:?}",
                std::fs::read_dir(&dest).map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
            )
        })
    };
    assert!(got("tree/p").file_type().is_fifo());
    assert_eq!(got("tree/p").mode() & 0o7777, 0o600);
    assert!(got("tree/n").file_type().is_char_device());
    assert_eq!(got("tree/n").rdev(), null);
    assert_eq!(
        std::fs::read(dest.join("tree/f")).unwrap(),
        b"a file beside them"
    );
    // A user may make the fifo but not the device node: it is skipped, and the rest arrives.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(c.path(""), std::fs::Permissions::from_mode(0o755)).unwrap();
    let user_kt = c.path("kt");
    std::fs::copy(kt_bin(), &user_kt).unwrap();
    let mine = c.path("users");
    std::fs::create_dir(&mine).unwrap();
    std::os::unix::fs::chown(&mine, Some(1000), Some(1000)).unwrap();
    let out = as_user(&format!(
        "KT_SERVER={} KT_AGENT=/nonexistent {} get tree --dest {}",
        c.server.addr,
        user_kt.display(),
        mine.display()
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::symlink_metadata(mine.join("tree/p"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert!(std::fs::symlink_metadata(mine.join("tree/n")).is_err());
    assert_eq!(
        std::fs::read(mine.join("tree/f")).unwrap(),
        b"a file beside them"
    );
}

#[test]
fn hard_links_are_two_names_of_one_file_on_every_node() {
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::new("127.0.0.168");
    let a = start_mount("127.0.0.168", &c.server.addr, &c.path("a"), "px-l", &[]);
    let b = start_mount("127.0.0.167", &c.server.addr, &c.path("b"), "px-m", &[]);
    std::fs::write(a.path("f"), b"one").unwrap();
    std::fs::create_dir(a.path("d")).unwrap();
    std::fs::hard_link(a.path("f"), a.path("d/g")).unwrap();
    let (f, g) = (lstat(&a.path("f")), lstat(&a.path("d/g")));
    assert_eq!(
        (f.st_ino, f.st_nlink),
        (g.st_ino, 2),
        "one inode, two names"
    );
    // A write through one name is read through the other, here and on the other node.
    std::fs::write(a.path("d/g"), b"two, and longer").unwrap();
    assert_eq!(std::fs::read(a.path("f")).unwrap(), b"two, and longer");
    assert!(eventually(std::time::Duration::from_secs(5), || {
        std::fs::read(b.path("f")).is_ok_and(|d| d == b"two, and longer")
            && lstat(&b.path("f")).st_nlink == 2
    }));
    // On the other node too, both names show one inode number (as `tar`, `du` and `rsync -H`
    // see a hard link), also after its kernel dropped what it cached.
    let same = || lstat(&b.path("f")).st_ino == lstat(&b.path("d/g")).st_ino;
    assert!(same(), "node B shows two numbers for one file");
    std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    assert!(
        same(),
        "node B shows two numbers for one file after a drop of caches"
    );
    // Metadata is the file's, whichever name changes it.
    std::fs::set_permissions(a.path("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let (f, g) = (lstat(&a.path("f")), lstat(&a.path("d/g")));
    assert_eq!(g.st_mode & 0o7777, 0o600);
    assert_eq!(ctime(&f), ctime(&g));
    assert!(eventually(std::time::Duration::from_secs(5), || {
        lstat(&b.path("d/g")).st_mode & 0o7777 == 0o600
    }));
    // Unlinking one name keeps the other, with its bytes.
    std::fs::remove_file(a.path("f")).unwrap();
    assert!(!a.path("f").exists());
    let g = lstat(&a.path("d/g"));
    assert_eq!(g.st_nlink, 1);
    assert_eq!(std::fs::read(a.path("d/g")).unwrap(), b"two, and longer");
    assert!(eventually(std::time::Duration::from_secs(5), || {
        !b.path("f").exists() && std::fs::read(b.path("d/g")).is_ok_and(|d| d == b"two, and longer")
    }));
    // A name moves as a name; a directory has one name only.
    std::fs::hard_link(a.path("d/g"), a.path("h")).unwrap();
    std::fs::rename(a.path("h"), a.path("d/h")).unwrap();
    assert_eq!(lstat(&a.path("d/h")).st_nlink, 2);
    // A third name: every name counts three.
    std::fs::hard_link(a.path("d/h"), a.path("t")).unwrap();
    for n in ["d/g", "d/h", "t"] {
        assert_eq!(lstat(&a.path(n)).st_nlink, 3, "{n}");
    }
    assert_eq!(
        errno_of(std::fs::hard_link(a.path("d"), a.path("d2"))),
        Some(libc::EPERM)
    );
    assert_eq!(
        errno_of(std::fs::hard_link(a.path("d/g"), a.path("d/h"))),
        Some(libc::EEXIST)
    );
    // `kt get` lands the names of one file as hard links, as `rsync -H` does; again onto
    // the same tree, it finds them already there.
    let got = c.path("got");
    for _ in 0..2 {
        c.ok(None, &["get", "d", "--dest", got.to_str().unwrap()]);
        let (g, h) = (lstat(&got.join("d/g")), lstat(&got.join("d/h")));
        assert_eq!((g.st_ino, g.st_nlink), (h.st_ino, 2), "one file, two names");
        assert_eq!(std::fs::read(got.join("d/h")).unwrap(), b"two, and longer");
    }
}

/// A directory of more keys than the store's engine commits in one change (etcd: 128
/// operations; each key moves several records) cannot be renamed atomically there: rename(2)
/// answers EXDEV, as between two filesystems, so `mv` copies it and removes the original. On
/// RocksDB it moves in one change. Either way nothing is lost (the test command's second pass
/// runs this on etcd).
#[test]
fn a_directory_too_large_to_move_in_one_change_is_refused_as_cross_device_and_mv_copies_it() {
    let c = Cluster::new("127.0.0.5");
    let a = start_mount("127.0.0.5", &c.server.addr, &c.path("a"), "px-mv", &[]);
    std::fs::create_dir(a.path("big")).unwrap();
    let body = |i: usize| format!("file {i}\n").repeat(i % 7 + 1);
    for i in 0..150 {
        std::fs::write(a.path(&format!("big/f{i:03}")), body(i)).unwrap();
    }
    match std::fs::rename(a.path("big"), a.path("moved")) {
        Ok(()) => assert!(!a.path("big").exists()),
        Err(e) => {
            assert_eq!(e.raw_os_error(), Some(libc::EXDEV), "{e}");
            assert_eq!(std::fs::read_dir(a.path("big")).unwrap().count(), 150);
            assert!(
                !a.path("moved").exists(),
                "a refused rename moved something"
            );
            let out = std::process::Command::new("mv")
                .arg(a.path("big"))
                .arg(a.path("moved"))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!a.path("big").exists());
        }
    }
    for i in 0..150 {
        let got = std::fs::read_to_string(a.path(&format!("moved/f{i:03}"))).unwrap();
        assert_eq!(got, body(i), "f{i:03}");
    }
}
