//! The filesystem core driven in-process, with no mount and no root: a real store server and a
//! real node agent bound to 127.0.0.1:0 in this process, and `FsCore` called as the FUSE
//! adapter calls it. Every operation, and the errno of each way it fails.

mod common;

use std::time::{Duration, UNIX_EPOCH};

use common::rig::Core;
use common::rig::Rig;
use ktfs::fs::names::inode::ROOT;
use ktfs::fs::{FsError, Kind, LISTING_TTL};
use ktfs::rpc::client::connect_store;

fn errno<T: std::fmt::Debug>(r: Result<T, FsError>) -> i32 {
    r.expect_err("an error").errno()
}

/// Writes `data` to a new file `name` below `parent` and closes it (publishing it).
fn write_file(core: &Core, parent: u64, name: &str, data: &[u8]) -> u64 {
    let (attr, fh) = core.create(parent, name, 0o644, libc::O_WRONLY).unwrap();
    assert_eq!(core.write(fh, 0, data).unwrap() as usize, data.len());
    core.flush(fh).unwrap();
    core.release(fh).unwrap();
    attr.ino
}

fn read_all(core: &Core, ino: u64) -> Vec<u8> {
    let (fh, _) = core.open(ino, libc::O_RDONLY).unwrap();
    let mut out = Vec::new();
    loop {
        let chunk = core.read(ino, fh, out.len() as u64, 1 << 20).unwrap();
        if chunk.is_empty() {
            break;
        }
        out.extend_from_slice(&chunk);
    }
    core.release(fh).unwrap();
    out
}

fn names(core: &Core, ino: u64) -> Vec<String> {
    let fh = core.opendir(ino).unwrap();
    let entries = core.readdir(ino, fh, 0).unwrap();
    core.release(fh).unwrap();
    entries.into_iter().map(|(_, e)| e.name).collect()
}

#[test]
fn files_are_written_published_read_renamed_and_removed_without_a_mount() {
    let rig = Rig::new();
    let core = rig.core();
    assert!(core.lookup(ROOT, "a.txt").unwrap_err().is_not_found());

    let data = common::pseudo_random(300_000, 1);
    let ino = write_file(&core, ROOT, "a.txt", &data);
    let a = core.lookup(ROOT, "a.txt").unwrap();
    assert_eq!(
        (a.ino, a.kind, a.size),
        (ino, Kind::File, data.len() as u64)
    );
    assert_eq!(read_all(&core, ino), data);
    // Published: another core (another mount) and the CLI see it.
    let other = rig.core();
    let seen = other.lookup(ROOT, "a.txt").unwrap().ino;
    assert_eq!(read_all(&other, seen), data);
    assert!(rig.kt(&["ls", "--json"]).contains("\"a.txt\""));

    let d = core.mkdir(ROOT, "d", 0o755).unwrap();
    assert_eq!(d.kind, Kind::Dir);
    assert_eq!(names(&core, ROOT), [".", "..", "a.txt", "d"]);
    core.rename(ROOT, "a.txt", d.ino, "b.txt", 0).unwrap();
    assert!(core.lookup(ROOT, "a.txt").unwrap_err().is_not_found());
    let b = core.lookup(d.ino, "b.txt").unwrap();
    // The kernel's inode follows the rename.
    assert_eq!(b.ino, ino);
    assert_eq!(read_all(&core, b.ino), data);

    // setattr: truncate, chmod and mtime, each visible at once.
    let t = UNIX_EPOCH + Duration::new(1_700_000_000, 0);
    let after = core
        .setattr(b.ino, Some(0o600), None, None, Some(1000), Some(t), None)
        .unwrap();
    assert_eq!((after.size, after.perm, after.mtime), (1000, 0o600, t));
    assert_eq!(read_all(&core, b.ino), data[..1000]);

    let l = core.symlink(d.ino, "link", "b.txt").unwrap();
    assert_eq!(l.kind, Kind::Symlink);
    assert_eq!(core.readlink(l.ino).unwrap(), "b.txt");

    assert_eq!(errno(core.rmdir(ROOT, "d")), libc::ENOTEMPTY);
    core.unlink(d.ino, "b.txt").unwrap();
    core.unlink(d.ino, "link").unwrap();
    core.rmdir(ROOT, "d").unwrap();
    assert_eq!(names(&core, ROOT), [".", ".."]);
}

#[test]
fn each_failure_has_its_errno() {
    let rig = Rig::new();
    let core = rig.core();
    let f = write_file(&core, ROOT, "f", b"bytes");
    let d = core.mkdir(ROOT, "d", 0o755).unwrap();

    let exists = core.create(
        ROOT,
        "f",
        0o644,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
    );
    assert_eq!(errno(exists), libc::EEXIST);
    assert_eq!(errno(core.mkdir(ROOT, "d", 0o755)), libc::EEXIST);
    assert_eq!(errno(core.open(d.ino, libc::O_RDONLY)), libc::EISDIR);
    assert_eq!(errno(core.opendir(f)), libc::ENOTDIR);
    assert_eq!(errno(core.readlink(f)), libc::EINVAL);
    assert_eq!(errno(core.rmdir(ROOT, "f")), libc::ENOTDIR);
    assert_eq!(errno(core.unlink(ROOT, "d")), libc::EISDIR);
    assert_eq!(errno(core.unlink(ROOT, "nothing")), libc::ENOENT);
    assert_eq!(errno(core.lookup(ROOT, "nothing")), libc::ENOENT);
    let long = "x".repeat(256);
    assert_eq!(
        errno(core.create(ROOT, &long, 0o644, 0)),
        libc::ENAMETOOLONG
    );
    assert_eq!(errno(core.getattr(987_654)), libc::ESTALE);
    assert_eq!(errno(core.write(1 << 40, 0, b"x")), libc::EBADF);
    // An odd handle nobody here made was a writer's in an agent that died: its bytes are lost.
    assert_eq!(errno(core.write((1 << 40) | 1, 0, b"x")), libc::EIO);
    assert_eq!(
        errno(core.rename(ROOT, "f", ROOT, "g", libc::RENAME_WHITEOUT)),
        libc::EINVAL
    );
    assert_eq!(
        errno(core.rename(ROOT, "f", ROOT, "d", libc::RENAME_NOREPLACE)),
        libc::EEXIST
    );
    assert_eq!(errno(core.rename(ROOT, "f", ROOT, "d", 0)), libc::EISDIR);
    // Owners change as asked: who may is the kernel's check (default_permissions), made
    // against the owners getattr reports (tests/posix.rs has a user refused).
    let other = core.getattr(f).unwrap().uid + 1;
    let a = core
        .setattr(f, None, Some(other), Some(77), None, None, None)
        .unwrap();
    assert_eq!((a.uid, a.gid), (other, 77));
    assert_eq!(
        errno(core.setxattr(d.ino, "user.other", b"v")),
        libc::ENOTSUP
    );
    assert_eq!(
        errno(core.setxattr(d.ino, "user.kt.locale", b"elsewhere")),
        libc::EINVAL
    );
    assert_eq!(
        errno(core.setxattr(f, "user.kt.locale", b"local")),
        libc::EINVAL
    );
    assert_eq!(errno(core.getxattr(d.ino, "user.kt.locale")), libc::ENODATA);
    assert_eq!(errno(core.getxattr(d.ino, "user.other")), libc::ENODATA);
    // No ACLs and no security labels: `ls -l` stops asking for them once told so.
    for name in ["security.selinux", "system.posix_acl_access", "trusted.x"] {
        assert_eq!(errno(core.getxattr(f, name)), libc::ENOTSUP, "{name}");
    }
    core.setxattr(d.ino, "user.kt.locale", b"local").unwrap();
    assert_eq!(core.getxattr(d.ino, "user.kt.locale").unwrap(), b"local");
    assert_eq!(core.listxattr(d.ino).unwrap(), b"user.kt.locale\0");

    let ro = rig.core_with(true);
    let root_ro = ro.lookup(ROOT, "f").unwrap();
    assert_eq!(errno(ro.create(ROOT, "new", 0o644, 0)), libc::EROFS);
    assert_eq!(errno(ro.open(root_ro.ino, libc::O_WRONLY)), libc::EROFS);
    assert_eq!(errno(ro.mkdir(ROOT, "x", 0o755)), libc::EROFS);
    assert_eq!(errno(ro.unlink(ROOT, "f")), libc::EROFS);
    assert_eq!(read_all(&ro, root_ro.ino), b"bytes");
}

#[test]
fn listings_are_trusted_for_their_lifetime_on_the_cores_clock() {
    let rig = Rig::new();
    let core = rig.core();
    assert_eq!(names(&core, ROOT), [".", ".."]);
    assert!(core.lookup(ROOT, "elsewhere").unwrap_err().is_not_found());
    // Published by another client: the cached listing of the root does not know it yet.
    let src = rig.dir.path().join("elsewhere");
    std::fs::write(&src, b"from the CLI").unwrap();
    rig.kt(&["put", "elsewhere", "--src", src.to_str().unwrap()]);
    assert!(core.lookup(ROOT, "elsewhere").unwrap_err().is_not_found());
    rig.clock.advance(LISTING_TTL - Duration::from_millis(1));
    assert!(core.lookup(ROOT, "elsewhere").unwrap_err().is_not_found());
    rig.clock.advance(Duration::from_millis(1));
    let e = core.lookup(ROOT, "elsewhere").unwrap();
    assert_eq!(read_all(&core, e.ino), b"from the CLI");
}

/// A reader is a member of the version's swarm: the seed that holds the file is its source,
/// and when that node dies, the store sends what it would have (the dead node still counts as
/// a holder for the others until its lease runs out).
#[test]
fn a_reader_whose_source_dies_is_sent_the_rest_by_the_store() {
    let rig = Rig::new();
    // A multi-block file in the store, fetched by node `a`, which seeds it.
    let src = rig.dir.path().join("big.bin");
    let data = common::pseudo_random(1 << 20, 7);
    std::fs::write(&src, &data).unwrap();
    let src = src.to_str().unwrap();
    rig.kt(&["put", "big.bin", "--src", src, "--block-size", "65536"]);
    let a_dir = rig.dir.path().join("a");
    let a = common::start_agent("127.0.0.1", &rig.server, &a_dir, "a");
    let got = a_dir.join("got");
    let fetched = common::kt_with(
        &rig.server,
        &a.socket,
        &["get", "big.bin", "--dest", got.to_str().unwrap()],
    );
    assert!(fetched.status.success(), "{fetched:?}");

    let core = rig.core();
    let ino = core.lookup(ROOT, "big.bin").unwrap().ino;
    let (fh, _) = core.open(ino, libc::O_RDONLY).unwrap();
    let file = core.read_file(fh).unwrap();
    let member = file
        .membership()
        .expect("a multi-block reader joins the window");
    // The first block, from `a` (a member that holds it comes before the store).
    let first = core.read(ino, fh, 0, 65536).unwrap();
    assert_eq!(&first[..], &data[..65536]);
    // (The read returns as the block arrives; its fetch reports its source a moment later.)
    let parents = || rig.rt.block_on(member.report()).parents;
    assert!(
        common::eventually(Duration::from_secs(5), || parents() == ["a"]),
        "{:?}",
        parents()
    );

    // `a` dies; the reader reads on.
    a.proc.kill();
    let mut out = first.to_vec();
    core.read_on(ino, fh, &mut out, data.len(), 1 << 20);
    assert!(out == data, "the bytes read after the failover differ");
    assert!(
        common::eventually(Duration::from_secs(5), || parents() == ["a", "store"]),
        "{:?}",
        parents()
    );
    core.release(fh).unwrap();
}

/// A cold read of a file looks for each block once in what the node holds: the read that finds
/// one missing gets its bytes from the fetch (or from the fetch ahead that was already under
/// way), never by looking again.
#[test]
fn a_cold_read_looks_up_each_block_once() {
    let rig = Rig::new();
    let src = rig.dir.path().join("cold.bin");
    let data = common::pseudo_random(1 << 20, 11);
    std::fs::write(&src, &data).unwrap();
    let src = src.to_str().unwrap();
    rig.kt(&["put", "cold.bin", "--src", src, "--block-size", "65536"]);

    let core = rig.core();
    let ino = core.lookup(ROOT, "cold.bin").unwrap().ino;
    let (fh, _) = core.open(ino, libc::O_RDONLY).unwrap();
    let blocks = core.read_file(fh).unwrap().entry.blocks.len() as u64;
    assert_eq!(blocks, 16);
    let before = core.block_lookups();
    let mut out = Vec::new();
    core.read_on(ino, fh, &mut out, data.len(), 128 << 10);
    assert!(out == data, "the bytes read differ");
    assert_eq!(core.block_lookups() - before, blocks);
    core.release(fh).unwrap();
}

#[test]
fn copy_range_and_fallocate_are_the_cores_own() {
    // Through a mount the kernel falls back to read and write when a filesystem lacks
    // copy_file_range; here nothing falls back, so this is the core's implementation.
    let rig = Rig::new();
    let core = rig.core();
    let data: Vec<u8> = (0..(3 << 20) + 77).map(|i| (i % 251) as u8).collect();
    let src = write_file(&core, ROOT, "src", &data);
    let (rd, _) = core.open(src, libc::O_RDONLY).unwrap();
    let (dst, wr) = core.create(ROOT, "dst", 0o644, libc::O_WRONLY).unwrap();
    let n = core
        .copy_range(src, rd, 5, wr, 0, data.len() as u64)
        .unwrap();
    assert_eq!(n as usize, data.len() - 5, "short only at the source's end");
    core.flush(wr).unwrap();
    assert_eq!(read_all(&core, dst.ino), &data[5..]);

    let (f, fh) = core.create(ROOT, "f", 0o644, libc::O_RDWR).unwrap();
    core.fallocate(fh, 0, 10_000, 0).unwrap();
    assert_eq!(core.getattr(f.ino).unwrap().size, 10_000);
    core.fallocate(fh, 0, 1 << 20, libc::FALLOC_FL_KEEP_SIZE)
        .unwrap();
    assert_eq!(core.getattr(f.ino).unwrap().size, 10_000);
    assert_eq!(
        errno(core.fallocate(
            fh,
            0,
            10,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
        )),
        libc::EOPNOTSUPP
    );
    // A descriptor open only for reading has nothing to extend.
    assert_eq!(errno(core.fallocate(rd, 0, 10, 0)), libc::EBADF);
}

/// A `locale=local` manifest's lengths are not the store's to check: one that gives a block
/// this node holds (1 MiB) a length of 4 MiB is published, and every reader must refuse the
/// block rather than slice past it or hand back short data.
#[test]
fn a_block_whose_length_the_manifest_lies_about_is_an_error_for_every_reader() {
    use ktfs::proto::{BlockRef, EntryKind, FileEntry, Locale, Manifest, PublishRequest};
    let rig = Rig::new();
    let core = rig.core();
    let data = common::pseudo_random(1 << 20, 23);
    let real = write_file(&core, ROOT, "real", &data);
    // Read here, so this node's cache holds the block and serves it to peers.
    assert_eq!(read_all(&core, real), data);
    let manifest = Manifest {
        block_size: 4 << 20,
        entries: vec![FileEntry {
            kind: EntryKind::File as i32,
            mode: 0o644,
            size: 4 << 20,
            blocks: vec![BlockRef {
                hash: blake3::hash(&data).as_bytes().to_vec(),
                len: 4 << 20,
            }],
            ..Default::default()
        }],
    };
    rig.rt
        .block_on(async {
            let store = connect_store(&rig.server, &ktfs::auth::Credential::none())
                .await
                .unwrap();
            store
                .publish(PublishRequest {
                    namespace: "default".into(),
                    key: "lie".into(),
                    manifest: Some(manifest),
                    locale: Locale::Local as i32,
                    origin_node: rig.agent.node_id.clone(),
                    ..Default::default()
                })
                .await
        })
        .expect("a locale=local publish of a block the store does not hold");

    // Another mount on this node: its listing is fresh, and it shares the node's blocks.
    let core = rig.core();
    let lie = core.lookup(ROOT, "lie").unwrap();
    assert_eq!(lie.size, 4 << 20);
    let (fh, _) = core.open(lie.ino, libc::O_RDONLY).unwrap();
    // Within the block's real bytes, and past them: both are EIO, neither a panic.
    for offset in [0, 2 << 20] {
        let err = match core.read(lie.ino, fh, offset, 1 << 20) {
            Ok(got) => panic!("a read at {offset} gave {} bytes, not an error", got.len()),
            Err(e) => e,
        };
        assert_eq!(err.errno(), libc::EIO, "{err}");
        assert!(
            err.to_string().contains(&format!("{} bytes", 1 << 20)),
            "{err}"
        );
    }
    core.release(fh).unwrap();
    // Copy on write copies nothing short either.
    assert_eq!(errno(core.open(lie.ino, libc::O_RDWR)), libc::EIO);

    // `kt get` fetches the block from this node's agent, which sends its 1 MiB: refused, with
    // the lengths in the error, and no file left.
    let dest = rig.dir.path().join("got");
    let out = common::kt_with(
        &rig.server,
        &rig.dir.path().join("no-agent.sock"),
        &["get", "lie", "--dest", dest.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("sent {} bytes", 1 << 20))
            && stderr.contains(&format!("says is {} bytes", 4 << 20)),
        "{stderr}"
    );
    assert!(!dest.exists());
}

/// Under write-back, a queued publish the store server refuses for good (another node made
/// the file's directory a file meanwhile) loses nothing: its bytes are kept in the staging
/// directory's `failed/`, and an fsync of the directory reports the refusal, once.
#[test]
fn a_refused_queued_publish_keeps_its_bytes_and_the_directorys_fsync_says_so() {
    let rig = Rig::new();
    let w = rig.writeback_core(b"refused\0");
    let other = rig.core();
    let d = w.mkdir(ROOT, "d", 0o755).unwrap();
    let (_, fh) = w.create(d.ino, "f", 0o644, libc::O_WRONLY).unwrap();
    w.write(fh, 0, b"precious bytes").unwrap();
    // Meanwhile another node removes the (still empty) directory and writes a file there.
    other.rmdir(ROOT, "d").unwrap();
    write_file(&other, ROOT, "d", b"a file now");
    // The close returns at once; the publish fails in the background.
    w.flush(fh).unwrap();
    w.release(fh).unwrap();
    assert_eq!(errno(w.fsyncdir(ROOT)), libc::EIO);
    w.fsyncdir(ROOT).unwrap();
    let failed = rig.dir.path().join("agent/staging/failed");
    let kept: Vec<Vec<u8>> = std::fs::read_dir(&failed)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(kept, [b"precious bytes".to_vec()]);
    // What the other node wrote stands.
    let d = other.lookup(ROOT, "d").unwrap();
    assert_eq!(read_all(&other, d.ino), b"a file now");
}

/// A chmod between a file's `close` (flush: published) and the kernel's release, which comes
/// after `close` returned: its ctime is the one the store keeps, before and after the release.
/// Made on the staged copy alone, the change was published by the release a moment later
/// under another ctime, and a stat between the two saw one that then moved by itself.
#[test]
fn a_chmod_between_close_and_release_keeps_the_ctime_it_answered() {
    let rig = Rig::new();
    let core = rig.core();
    let (attr, fh) = core.create(ROOT, "f", 0o644, libc::O_WRONLY).unwrap();
    core.write(fh, 0, b"published at close").unwrap();
    core.flush(fh).unwrap();
    let changed = core
        .setattr(attr.ino, Some(0o600), None, None, None, None, Some(fh))
        .unwrap();
    assert_eq!(changed.perm, 0o600);
    let other = rig.core();
    let ino = other.lookup(ROOT, "f").unwrap().ino;
    let stored = other.getattr(ino).unwrap();
    assert_eq!((stored.perm, stored.ctime), (0o600, changed.ctime));
    core.release(fh).unwrap();
    let after = core.getattr(attr.ino).unwrap();
    assert_eq!((after.perm, after.ctime), (0o600, changed.ctime));
}
