//! Claims of doc/SEMANTICS.md that no other test checks: what a writer's close and fsync
//! publish and what stays on its node until then, that a reader keeps the version it opened,
//! that a rename moves names and not bytes, what a crashed agent loses and keeps, and modes
//! seen by every node. The mount tests need /dev/fuse and root; they never skip themselves.

mod common;

use std::os::unix::fs::{FileExt, PermissionsExt};
use std::time::Duration;

use common::rig::Core;
use common::rig::Rig;
use common::*;
use ktfs::fs::names::inode::ROOT;
use ktfs::fs::LISTING_TTL;

/// What a reader on another node may wait for: its listing cache and the kernel's attribute
/// cache each live a second.
const SETTLE: Duration = Duration::from_secs(10);

fn read_fh(core: &Core, ino: u64, fh: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let chunk = core.read(ino, fh, out.len() as u64, 1 << 20).unwrap();
        if chunk.is_empty() {
            return out;
        }
        out.extend_from_slice(&chunk);
    }
}

fn read_path(core: &Core, parent: u64, name: &str) -> Vec<u8> {
    let ino = core.lookup(parent, name).unwrap().ino;
    let (fh, _) = core.open(ino, libc::O_RDONLY).unwrap();
    let out = read_fh(core, ino, fh);
    core.release(fh).unwrap();
    out
}

#[test]
fn a_write_is_staged_until_close_or_fsync_and_a_reader_keeps_the_version_it_opened() {
    let rig = Rig::new();
    // Two cores are two nodes' mounts of one namespace.
    let (a, b) = (rig.core(), rig.core());
    let (_, fh) = a.create(ROOT, "f", 0o644, libc::O_WRONLY).unwrap();
    a.write(fh, 0, b"version one").unwrap();
    // Not yet published: the other node has no such file.
    assert!(b.lookup(ROOT, "f").unwrap_err().is_not_found());
    a.flush(fh).unwrap();
    a.release(fh).unwrap();
    rig.clock.advance(LISTING_TTL);
    let ino_b = b.lookup(ROOT, "f").unwrap().ino;
    let (old, _) = b.open(ino_b, libc::O_RDONLY).unwrap();

    // A rewrite, longer: staged on A (which reads its own bytes), not seen on B.
    let ino_a = a.lookup(ROOT, "f").unwrap().ino;
    let (fh, _) = a.open(ino_a, libc::O_WRONLY | libc::O_TRUNC).unwrap();
    a.write(fh, 0, b"the second version").unwrap();
    assert_eq!(read_path(&a, ROOT, "f"), b"the second version");
    rig.clock.advance(LISTING_TTL);
    assert_eq!(read_path(&b, ROOT, "f"), b"version one");
    // fsync publishes with the file still open (the adapter's fsync is the core's flush).
    a.flush(fh).unwrap();
    rig.clock.advance(LISTING_TTL);
    assert_eq!(read_path(&b, ROOT, "f"), b"the second version");
    a.write(fh, 0, b"THE").unwrap();
    a.release(fh).unwrap();
    rig.clock.advance(LISTING_TTL);
    assert_eq!(read_path(&b, ROOT, "f"), b"THE second version");
    // The reader that opened before both publishes reads the version it opened, whole.
    assert_eq!(read_fh(&b, ino_b, old), b"version one");
    b.release(old).unwrap();
}

#[test]
fn a_rename_moves_names_not_bytes_and_other_nodes_see_the_whole_move() {
    let rig = Rig::new();
    let (a, b) = (rig.core(), rig.core());
    let d = a.mkdir(ROOT, "d", 0o755).unwrap();
    let sub = a.mkdir(d.ino, "sub", 0o755).unwrap();
    let data = pseudo_random(3 << 20, 5);
    for (parent, name) in [(d.ino, "big"), (sub.ino, "small")] {
        let (_, fh) = a.create(parent, name, 0o644, libc::O_WRONLY).unwrap();
        a.write(fh, 0, &data).unwrap();
        a.flush(fh).unwrap();
        a.release(fh).unwrap();
    }
    let version = |core: &Core, path: &[&str]| {
        let mut ino = ROOT;
        for name in path {
            ino = core.lookup(ino, name).unwrap().ino;
        }
        let (fh, _) = core.open(ino, libc::O_RDONLY).unwrap();
        let v = core.read_file(fh).unwrap().version;
        core.release(fh).unwrap();
        v
    };
    let before = (
        version(&b, &["d", "big"]),
        version(&b, &["d", "sub", "small"]),
    );
    a.rename(ROOT, "d", ROOT, "e", 0).unwrap();
    rig.clock.advance(LISTING_TTL);
    // The other node: the old name is gone, the new one holds the whole tree, and each file
    // is the version it was (its manifest moved; no byte was hashed or sent again).
    assert!(b.lookup(ROOT, "d").unwrap_err().is_not_found());
    let after = (
        version(&b, &["e", "big"]),
        version(&b, &["e", "sub", "small"]),
    );
    assert_eq!(before, after);
    let e = b.lookup(ROOT, "e").unwrap().ino;
    assert!(read_path(&b, e, "big") == data);
}

#[test]
fn fsync_publishes_to_other_nodes_and_modes_are_shared() {
    let c = Cluster::new("127.0.0.181");
    let a = start_mount("127.0.0.181", &c.server.addr, &c.path("a"), "sem-a", &[]);
    let b = start_mount("127.0.0.182", &c.server.addr, &c.path("b"), "sem-b", &[]);
    std::fs::write(a.path("f"), b"first bytes").unwrap();
    assert!(eventually(SETTLE, || std::fs::read(b.path("f"))
        .is_ok_and(|d| d == b"first bytes")));
    // Same length, so that B's cached size is no obstacle to seeing the new bytes.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(a.path("f"))
        .unwrap();
    f.write_all_at(b"later", 0).unwrap();
    assert_eq!(std::fs::read(b.path("f")).unwrap(), b"first bytes");
    f.sync_all().unwrap();
    assert_eq!(std::fs::read(b.path("f")).unwrap(), b"later bytes");
    drop(f);

    std::fs::create_dir(a.path("d")).unwrap();
    std::fs::set_permissions(a.path("f"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::fs::set_permissions(a.path("d"), std::fs::Permissions::from_mode(0o711)).unwrap();
    let mode =
        |p: &str| std::fs::metadata(b.path(p)).map_or(0, |m| m.permissions().mode() & 0o7777);
    assert!(
        eventually(SETTLE, || mode("f") == 0o640 && mode("d") == 0o711),
        "the other node shows {:o} and {:o}",
        mode("f"),
        mode("d")
    );
}

#[test]
fn a_crashed_agent_loses_unclosed_writes_and_keeps_what_was_published() {
    let c = Cluster::new("127.0.0.183");
    let dir = c.path("a");
    let mut a = start_mount("127.0.0.183", &c.server.addr, &dir, "sem-c", &[]);
    std::fs::write(a.path("kept"), b"published before the crash").unwrap();
    let rewrite = std::fs::OpenOptions::new()
        .write(true)
        .open(a.path("kept"))
        .unwrap();
    rewrite.write_all_at(b"PUBLISHED", 0).unwrap();
    let new = std::fs::File::create(a.path("lost")).unwrap();
    new.write_all_at(b"never closed", 0).unwrap();
    a.crash();
    drop((rewrite, new));

    // The same node again, on the same cache and staging directory.
    let a = start_mount("127.0.0.183", &c.server.addr, &dir, "sem-c", &[]);
    assert_eq!(
        std::fs::read(a.path("kept")).unwrap(),
        b"published before the crash"
    );
    assert!(!a.path("lost").exists());
    assert_eq!(c.kt(None, &["ls", "lost"]).status.code(), Some(3));
}
