//! Tests of registering and serving files in place.

use super::*;

#[test]
fn a_sweep_of_seeded_copies_goes_a_part_at_a_time_and_finds_those_gone() {
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("db"), &[CF_LOCAL, CF_SEEDS], &[]).unwrap();
    let p = InPlace::new(db);
    let files: Vec<LocalFile> = (0..3)
        .map(|i| {
            let path = dir.path().join(format!("f{i}"));
            std::fs::write(&path, format!("file {i}")).unwrap();
            LocalFile {
                entry_path: String::new(),
                disk_path: path.display().to_string(),
            }
        })
        .collect();
    for (i, f) in files.iter().enumerate() {
        p.record_seed(
            &Version([i as u8; 32]),
            std::slice::from_ref(f),
            &open_regular,
        )
        .unwrap();
    }
    std::fs::remove_file(&files[0].disk_path).unwrap();
    std::fs::write(&files[2].disk_path, "changed, longer").unwrap();
    // Two files a sweep: the first sees versions 0 and 1, the next version 2, then it wraps.
    let (gone, next) = p.sweep_seeds(&[], 2).unwrap();
    assert_eq!(gone, [Version([0; 32])]);
    assert_eq!(next[..32], [2u8; 32]);
    let (gone, next) = p.sweep_seeds(&next, 2).unwrap();
    assert_eq!(gone, [Version([2; 32])]);
    assert!(next.is_empty());
    // Forgotten once told: a whole sweep finds nothing more.
    p.forget_seeds(&[Version([0; 32]), Version([2; 32])])
        .unwrap();
    let (gone, _) = p.sweep_seeds(&[], 100).unwrap();
    assert!(gone.is_empty());

    // Two copies of one version (two gets to two places): one removed, the version stays
    // seeded; both removed, it is gone.
    let v = Version([9; 32]);
    let copy = |name: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, "copy").unwrap();
        LocalFile {
            entry_path: String::new(),
            disk_path: path.display().to_string(),
        }
    };
    let (c1, c2) = (copy("c1"), copy("c2"));
    p.record_seed(&v, std::slice::from_ref(&c1), &open_regular)
        .unwrap();
    p.record_seed(&v, std::slice::from_ref(&c2), &open_regular)
        .unwrap();
    // The copy recorded last goes first (one record per version would forget c1).
    std::fs::remove_file(&c2.disk_path).unwrap();
    assert!(p.sweep_seeds(&[], 100).unwrap().0.is_empty());
    std::fs::remove_file(&c1.disk_path).unwrap();
    assert_eq!(p.sweep_seeds(&[], 100).unwrap().0, [v]);
}

/// Watches `path` for opens (inotify's `IN_OPEN`): the second call says whether any
/// happened since the first, from the kernel's queue, without waiting.
fn watch_opens(path: &Path) -> impl Fn() -> bool {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: plain system calls on a valid C string; the descriptor is this test's.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    assert!(fd >= 0);
    assert!(unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_OPEN) } >= 0);
    move || {
        let mut buf = [0u8; 4096];
        // SAFETY: reads into a buffer of the length given.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        n > 0
    }
}

/// A registered path swapped for a symbolic link (to a file of the same bytes, here; to a
/// device, an attacker's choice) is refused before the link's target is opened, where
/// following it opened the target and only then saw another file. A path registered
/// through a link among its directories is recorded resolved, and served.
/// A seed hashes only the blocks this agent did not hash serving them in flight; bytes
/// changed after that are registered, and never served.
#[test]
fn a_seed_hashes_only_what_was_not_hashed_as_it_was_served() {
    use super::super::in_flight::{InFlight, Place};
    use crate::proto::{BlockRef, FileEntry};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("db"), &[CF_LOCAL, CF_SEEDS], &[]).unwrap();
    let p = InPlace::new(db);
    let (a, b) = (vec![1u8; 1000], vec![2u8; 1000]);
    let (ha, hb) = (BlockHash::of(&a), BlockHash::of(&b));
    let path = dir.path().join("f");
    std::fs::write(&path, [a.clone(), b.clone()].concat()).unwrap();
    let m = Manifest {
        entries: vec![FileEntry {
            size: 2000,
            blocks: [ha, hb]
                .iter()
                .map(|h| BlockRef {
                    hash: h.0.to_vec(),
                    len: 1000,
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let file = Arc::new(std::fs::File::open(&path).unwrap());
    let place = |offset| Place {
        file: file.clone(),
        offset,
        len: 1000,
    };
    let inf = InFlight::default();
    let id = inf.open(HashMap::from([
        (ha, vec![place(0)]),
        (hb, vec![place(1000)]),
    ]));
    inf.ready(id, &[ha, hb]);
    // A peer is served block a; nobody asks for b.
    assert_eq!(inf.read(&ha).as_deref(), Some(&a[..]));
    let known = inf.checked();
    assert_eq!(known.len(), 1);
    // Both blocks changed under the offer after that: b's change is found by the seed's
    // hashing, a's is not looked for again...
    let w = std::fs::File::options().write(true).open(&path).unwrap();
    w.write_all_at(&[9u8; 1000], 1000).unwrap();
    let f = LocalFile {
        entry_path: String::new(),
        disk_path: path.display().to_string(),
    };
    let err = p
        .register_known(
            &m,
            std::slice::from_ref(&f),
            Check::Hashes,
            &known,
            &open_regular,
        )
        .unwrap_err();
    assert!(
        matches!(err, InPlaceError::NotItsBlock { index: 1, .. }),
        "{err}"
    );
    w.write_all_at(&b, 1000).unwrap();
    w.write_all_at(&[9u8; 1000], 0).unwrap();
    assert_eq!(
        p.register_known(
            &m,
            std::slice::from_ref(&f),
            Check::Hashes,
            &known,
            &open_regular
        )
        .unwrap(),
        2
    );
    // ...and is never served: every read of a place is checked against its hash.
    assert!(p.find(&ha).unwrap().is_none());
    assert_eq!(p.find(&hb).unwrap().as_deref(), Some(&b[..]));
    // Without what was hashed in flight, the seed hashes every block.
    let err = p
        .register(&m, &[f], Check::Hashes, &open_regular)
        .unwrap_err();
    assert!(
        matches!(err, InPlaceError::NotItsBlock { index: 0, .. }),
        "{err}"
    );
}

/// Of a block whose pieces were partly hashed as they were served, a seed hashes the
/// others only.
#[test]
fn a_seed_hashes_the_pieces_not_hashed_as_they_were_served() {
    use super::super::in_flight::Checked;
    use crate::hash::subtree::Cut;
    use crate::proto::{BlockRef, FileEntry};
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("db"), &[CF_LOCAL, CF_SEEDS], &[]).unwrap();
    let p = InPlace::new(db);
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 5 % 249) as u8).collect();
    let h = BlockHash::of(&data);
    let path = dir.path().join("f");
    std::fs::write(&path, &data).unwrap();
    let m = Manifest {
        entries: vec![FileEntry {
            size: 200_000,
            blocks: vec![BlockRef {
                hash: h.0.to_vec(),
                len: 200_000,
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let cut = Cut::new(200_000, 1 << 16).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    let at = Checked {
        dev: meta.dev(),
        ino: meta.ino(),
        offset: 0,
        hash: h,
    };
    let known = HashMap::from([(
        at,
        Hashed::Pieces {
            cut,
            cvs: cut.cvs(&data).unwrap(),
            done: vec![true, false, true, false],
        },
    )]);
    let f = LocalFile {
        entry_path: String::new(),
        disk_path: path.display().to_string(),
    };
    let w = std::fs::File::options().write(true).open(&path).unwrap();
    let seed = || {
        p.register_known(
            &m,
            std::slice::from_ref(&f),
            Check::Hashes,
            &known,
            &open_regular,
        )
    };
    // A byte changed in piece 1, which was not hashed: found.
    w.write_all_at(&[data[70_000] ^ 1], 70_000).unwrap();
    assert!(matches!(
        seed(),
        Err(InPlaceError::NotItsBlock { index: 0, .. })
    ));
    // In piece 2, which was: not looked for again (and never served).
    w.write_all_at(&data[70_000..70_001], 70_000).unwrap();
    w.write_all_at(&[data[140_000] ^ 1], 140_000).unwrap();
    assert_eq!(seed().unwrap(), 1);
    assert!(p.find(&h).unwrap().is_none());
    // Every piece hashed as it was served: nothing of the block is hashed again.
    w.write_all_at(&[data[70_000] ^ 1], 70_000).unwrap();
    let all = HashMap::from([(
        at,
        Hashed::Pieces {
            cut,
            cvs: cut.cvs(&data).unwrap(),
            done: vec![true; 4],
        },
    )]);
    let seeded = p.register_known(
        &m,
        std::slice::from_ref(&f),
        Check::Hashes,
        &all,
        &open_regular,
    );
    assert_eq!(seeded.unwrap(), 1);
}

#[test]
fn a_registered_path_swapped_for_a_link_is_refused_before_its_target_is_opened() {
    use crate::proto::{BlockRef, FileEntry};
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("db"), &[CF_LOCAL, CF_SEEDS], &[]).unwrap();
    let p = InPlace::new(db);
    let data = b"served in place".to_vec();
    std::fs::create_dir(dir.path().join("real")).unwrap();
    std::fs::write(dir.path().join("real/f"), &data).unwrap();
    symlink(dir.path().join("real"), dir.path().join("via")).unwrap();
    let h = BlockHash::of(&data);
    let m = Manifest {
        entries: vec![FileEntry {
            size: data.len() as u64,
            blocks: vec![BlockRef {
                hash: h.0.to_vec(),
                len: data.len() as u32,
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let f = LocalFile {
        entry_path: String::new(),
        disk_path: dir.path().join("via/f").display().to_string(),
    };
    p.register(&m, &[f], Check::Hashes, &open_regular).unwrap();
    assert_eq!(p.read_range(&h, 0, data.len()).as_deref(), Some(&data[..]));

    let target = dir.path().join("target");
    std::fs::write(&target, &data).unwrap();
    let opened = watch_opens(&target);
    std::fs::remove_file(dir.path().join("real/f")).unwrap();
    symlink(&target, dir.path().join("real/f")).unwrap();
    assert!(p.read_range(&h, 0, data.len()).is_none());
    assert!(!opened(), "the link's target was opened");
}

#[test]
fn a_range_of_a_block_in_place_is_read_alone_while_its_file_is_the_one_registered_unchanged() {
    use crate::proto::{BlockRef, FileEntry};
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("db"), &[CF_LOCAL, CF_SEEDS], &[]).unwrap();
    let p = InPlace::new(db);
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let (first, second) = data.split_at(3000);
    let path = dir.path().join("f");
    std::fs::write(&path, &data).unwrap();
    let m = Manifest {
        entries: vec![FileEntry {
            path: "f".into(),
            size: 5000,
            blocks: [first, second]
                .iter()
                .map(|b| BlockRef {
                    hash: BlockHash::of(b).0.to_vec(),
                    len: b.len() as u32,
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let f = LocalFile {
        entry_path: "f".into(),
        disk_path: path.display().to_string(),
    };
    assert_eq!(
        p.register(&m, &[f], Check::Hashes, &open_regular).unwrap(),
        2
    );
    let h = BlockHash::of(second);
    assert_eq!(
        p.read_range(&h, 100, 50).as_deref(),
        Some(&second[100..150])
    );
    assert_eq!(p.read_range(&h, 1990, 10).as_deref(), Some(&second[1990..]));
    assert!(p.read_range(&h, 1990, 11).is_none(), "past the block's end");
    assert!(p.read_range(&BlockHash::of(b"x"), 0, 1).is_none());
    // Another file of the same bytes and times in its place (a symlink or rename swapped
    // in): not the file registered, not served from.
    let was = std::fs::metadata(&path).unwrap().modified().unwrap();
    let other = dir.path().join("other");
    std::fs::write(&other, &data).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&other)
        .unwrap()
        .set_modified(was)
        .unwrap();
    std::fs::rename(&other, &path).unwrap();
    assert!(p.read_range(&h, 100, 50).is_none(), "another file");
    std::fs::write(&path, [&data[..], b"more"].concat()).unwrap();
    assert!(p.read_range(&h, 100, 50).is_none(), "the file changed");

    // Swapped for a FIFO no one writes to: refused at once, where opening it blocked.
    std::fs::remove_file(&path).unwrap();
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; mkfifo reads nothing else.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send((p.find(&h).unwrap(), p.read_range(&h, 0, 1)));
    });
    let answered = rx.recv_timeout(std::time::Duration::from_secs(10));
    assert!(
        matches!(answered, Ok((None, None))),
        "a FIFO in a published file's place: {answered:?}"
    );
}
