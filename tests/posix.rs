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

    // kt put keeps a source's owner; kt get, as root, gives it back.
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
        .kt(None, &["get", "owned", "--dest", dest.to_str().unwrap()])
        .status
        .success());
    assert_eq!(owner(&dest), (1234, 5678));
}
