//! The mounts' watch of their namespace (the store server's `Watch` stream): a change made on
//! one node is told to every other mount that cached what it changes before its writer is
//! answered, so the next lookup on
//! another node shows it even while that node's listing of the directory (or a file's
//! version, for the next open) is cached; a mount
//! that stops answering holds a change for its lease only, and is dropped. Real processes: a
//! store server and two `kt mount`s. These tests need /dev/fuse and root; they never skip
//! themselves.

mod common;

use std::time::{Duration, Instant};

use common::*;

fn pid(m: &MountProc) -> i32 {
    m.proc.as_ref().expect("running").child.id() as i32
}

/// A store server and two mounts of it, A on `ip_a` and B on `ip_b`, both watching.
fn two_nodes(ip_a: &str, ip_b: &str) -> (Cluster, MountProc, MountProc) {
    two_watching_mounts(ip_a, ip_b, &[])
}

#[test]
fn a_change_on_one_node_is_seen_by_the_next_lookup_on_another() {
    let (c, a, b) = two_nodes("127.0.0.198", "127.0.0.199");
    std::fs::create_dir(a.path("d")).unwrap();
    assert!(eventually(Duration::from_secs(5), || b.path("d").is_dir()));
    for i in 0..30 {
        let name = format!("d/n{i}");
        // B looks first: its listing of d, without the name, is cached.
        assert!(std::fs::metadata(b.path(&name)).is_err());
        let listed = |n: &str| {
            std::fs::read_dir(b.path("d"))
                .unwrap()
                .any(|e| e.unwrap().file_name() == n)
        };
        assert!(!listed(&format!("n{i}")));
        std::fs::write(a.path(&name), format!("round {i}")).unwrap();
        assert!(listed(&format!("n{i}")), "round {i}: not listed");
        // A's close returned: B was told, and its next lookup asks again.
        assert_eq!(
            std::fs::read_to_string(b.path(&name)).unwrap(),
            format!("round {i}"),
            "round {i}"
        );
    }
    // A rename and a removal, the same.
    assert!(std::fs::metadata(b.path("d/moved")).is_err());
    std::fs::rename(a.path("d/n0"), a.path("d/moved")).unwrap();
    assert_eq!(
        std::fs::read_to_string(b.path("d/moved")).unwrap(),
        "round 0"
    );
    std::fs::remove_file(a.path("d/n1")).unwrap();
    assert!(std::fs::read(b.path("d/n1")).is_err());
    let names: Vec<String> = std::fs::read_dir(b.path("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 29);
    // A file B has open-ed before (its version cached under B's lease), rewritten on A: B's
    // next open reads the new bytes.
    for round in 0..10 {
        assert!(std::fs::read(b.path("d/n2")).is_ok());
        let text = format!("rewritten {round}");
        std::fs::write(a.path("d/n2"), &text).unwrap();
        // The kernel's attributes of it (its size) were forgotten too.
        assert_eq!(
            std::fs::metadata(b.path("d/n2")).unwrap().len(),
            text.len() as u64
        );
        assert_eq!(std::fs::read_to_string(b.path("d/n2")).unwrap(), text);
    }
    assert!(names.contains(&"moved".to_string()) && !names.contains(&"n1".to_string()));
    assert_eq!(metric(&c.server.addr, "kt_watch_lapsed_total"), 0.0);
}

/// A key put by a client (not a mount) under directories that were not there makes them: a
/// mount that saw them missing (a lookup, its listing of the directory above) sees the whole
/// new path as soon as the put returns, as it does a new directory under one that exists.
#[test]
fn a_key_put_under_directories_a_mount_saw_missing_is_seen_as_soon_as_the_put_returns() {
    let (c, a, _b) = two_nodes("127.0.0.202", "127.0.0.203");
    let src = c.path("src");
    std::fs::write(&src, b"under new directories\n").unwrap();
    let names = |dir: &str| -> Vec<String> {
        std::fs::read_dir(a.path(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    std::fs::create_dir(a.path("old")).unwrap();
    assert!(std::fs::metadata(a.path("fresh")).is_err());
    assert!(std::fs::metadata(a.path("fresh/sub/k")).is_err());
    assert!(std::fs::metadata(a.path("old/sub")).is_err());
    assert!(!names("").contains(&"fresh".to_string()));
    assert!(names("old").is_empty());
    for key in ["fresh/sub/k", "old/sub/k"] {
        c.ok(None, &["put", key, "--src", src.to_str().unwrap()]);
        assert_eq!(
            std::fs::read(a.path(key)).unwrap(),
            b"under new directories\n",
            "{key}"
        );
    }
    assert!(names("").contains(&"fresh".to_string()));
    assert_eq!(names("old"), ["sub"]);
    assert_eq!(names("fresh/sub"), ["k"]);
}

#[test]
fn a_change_is_told_only_to_the_mounts_that_cached_what_it_changes() {
    let (c, a, b) = two_nodes("127.0.0.251", "127.0.0.252");
    std::fs::create_dir(a.path("seen")).unwrap();
    std::fs::create_dir_all(a.path("elsewhere/deeper")).unwrap();
    // B looks at seen alone (the root's listing and seen's are cached under its lease).
    assert!(eventually(Duration::from_secs(5), || b
        .path("seen")
        .is_dir()));
    assert_eq!(std::fs::read_dir(b.path("seen")).unwrap().count(), 0);
    let recalls = || metric(&c.server.addr, "kt_watch_recalls_total");
    let before = recalls();
    for i in 0..30 {
        std::fs::write(a.path(&format!("elsewhere/deeper/f{i}")), format!("v{i}")).unwrap();
    }
    assert_eq!(
        recalls() - before,
        0.0,
        "B was told of files below a directory it never looked at"
    );
    // A change of what B cached is told to it before A's close returns.
    std::fs::write(a.path("seen/new"), b"new").unwrap();
    assert!(recalls() > before);
    assert_eq!(std::fs::read(b.path("seen/new")).unwrap(), b"new");
    // Once B has looked at a file there, a change of it is told to B too.
    assert_eq!(
        std::fs::read_to_string(b.path("elsewhere/deeper/f3")).unwrap(),
        "v3"
    );
    let before = recalls();
    std::fs::write(a.path("elsewhere/deeper/f3"), b"changed").unwrap();
    assert!(recalls() > before);
    assert_eq!(
        std::fs::read(b.path("elsewhere/deeper/f3")).unwrap(),
        b"changed"
    );
    assert_eq!(metric(&c.server.addr, "kt_watch_lapsed_total"), 0.0);
}

#[test]
fn a_mount_that_stops_answering_holds_a_change_for_its_lease_only_and_watches_again() {
    let (c, a, b) = two_nodes("127.0.0.200", "127.0.0.208");
    // B caches the root's listing under its lease, so a new name there concerns it. (Without
    // this the test leaned on whatever looked at B's root as it mounted, which CI once did not.)
    assert_eq!(std::fs::read_dir(&b.mountpoint).unwrap().count(), 0);
    assert!(std::fs::metadata(b.path("while-stopped")).is_err());
    signal(pid(&b), libc::SIGSTOP);
    let started = Instant::now();
    std::fs::write(a.path("while-stopped"), b"x").unwrap();
    let held = started.elapsed();
    // The next change waits for nobody: B was dropped.
    std::fs::write(a.path("after"), b"y").unwrap();
    let lapsed = metric(&c.server.addr, "kt_watch_lapsed_total");
    let left = metric(&c.server.addr, "kt_watchers");
    signal(pid(&b), libc::SIGCONT);
    assert!(held < Duration::from_secs(10), "held {held:?}");
    assert_eq!((lapsed, left), (1.0, 1.0));
    // B notices its stream ended, watches again, and is told of changes at once again.
    watchers(&c.server.addr, 2.0);
    assert_eq!(std::fs::read(b.path("while-stopped")).unwrap(), b"x");
    for i in 0..5 {
        let name = format!("again{i}");
        assert!(std::fs::metadata(b.path(&name)).is_err());
        std::fs::write(a.path(&name), b"z").unwrap();
        assert_eq!(std::fs::read(b.path(&name)).unwrap(), b"z", "round {i}");
    }
}

#[test]
fn while_its_lease_holds_a_mount_answers_lookups_from_what_it_cached() {
    let c = Cluster::new("127.0.0.209");
    let a = start_mount("127.0.0.209", &c.server.addr, &c.path("a"), "la", &[]);
    watchers(&c.server.addr, 1.0);
    std::fs::create_dir_all(a.path("x/y")).unwrap();
    std::fs::write(a.path("x/y/f"), b"cached").unwrap();
    let agent = &a.proc.as_ref().expect("running").addr;
    let asked = || metric(agent, "kt_mount_metadata_requests_total");
    std::fs::metadata(a.path("x/y/f")).unwrap();
    assert!(std::fs::metadata(a.path("x/y/missing")).is_err());
    assert_eq!(std::fs::read(a.path("x/y/f")).unwrap(), b"cached");
    assert_eq!(std::fs::read_dir(a.path("x/y")).unwrap().count(), 1);
    let before = asked();
    // Well past the listings' TTL (and the kernel's, which asks again every second).
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        assert_eq!(std::fs::metadata(a.path("x/y/f")).unwrap().len(), 6);
        assert!(std::fs::metadata(a.path("x/y/missing")).is_err());
        // An open of the unchanged file, and a listing of its directory, too.
        assert_eq!(std::fs::read(a.path("x/y/f")).unwrap(), b"cached");
        assert_eq!(std::fs::read_dir(a.path("x/y")).unwrap().count(), 1);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(asked(), before, "a lookup or open asked the store server");
    // A change forgets it: the next open reads the new version.
    std::fs::write(a.path("x/y/f"), b"changed").unwrap();
    assert_eq!(std::fs::read(a.path("x/y/f")).unwrap(), b"changed");
}

#[test]
fn a_write_through_one_name_of_a_hard_linked_file_reaches_its_other_names_elsewhere() {
    let (_c, a, b) = two_nodes("127.0.0.228", "127.0.0.229");
    std::fs::create_dir(a.path("p")).unwrap();
    std::fs::write(a.path("x"), b"short").unwrap();
    std::fs::hard_link(a.path("x"), a.path("p/y")).unwrap();
    // B caches p's listing, with y's size in it, under its lease.
    assert!(eventually(Duration::from_secs(5), || {
        std::fs::metadata(b.path("p/y")).is_ok_and(|m| m.len() == 5)
    }));
    std::fs::write(a.path("x"), b"a longer text").unwrap();
    // The change named x only; y's entry, and the kernel's attributes of y, are B's too.
    assert_eq!(std::fs::metadata(b.path("p/y")).unwrap().len(), 13);
    assert_eq!(std::fs::read(b.path("p/y")).unwrap(), b"a longer text");
}

/// A mount's own publishes are not told back to it (they name its watcher): its cached listing
/// of a directory takes each new file instead of being forgotten, so writing many files into
/// one directory lists it about once, not twice per file (a `cp -r` listed each directory again
/// after every file, O(n) each, before).
#[test]
fn a_mount_writing_many_files_into_a_directory_lists_it_about_once() {
    let (c, a, b) = two_nodes("127.0.0.222", "127.0.0.223");
    let agent = a.proc.as_ref().expect("running").addr.clone();
    std::fs::create_dir(a.path("many")).unwrap();
    let before = metric(&agent, "kt_mount_metadata_requests_total");
    for i in 0..100 {
        std::fs::write(a.path(&format!("many/f{i}")), b"x").unwrap();
    }
    let asked = metric(&agent, "kt_mount_metadata_requests_total") - before;
    assert!(
        asked <= 20.0,
        "{asked} metadata requests for 100 files written"
    );
    // And the other mount was told of each: it sees all of them.
    assert_eq!(std::fs::read_dir(b.path("many")).unwrap().count(), 100);
    assert_eq!(metric(&c.server.addr, "kt_watch_lapsed_total"), 0.0);
}

/// A mount's own mkdir is not told back to it (the publish's answer carries the new entry):
/// a `cp -r` of a tree into a mount makes each directory without a recall of its own listing
/// or a re-listing of its parent.
#[test]
fn a_mount_making_directories_is_not_told_of_its_own_mkdirs() {
    let (c, a, b) = two_nodes("127.0.0.201", "127.0.0.202");
    let agent = a.proc.as_ref().expect("running").addr.clone();
    std::fs::create_dir_all(a.path("top/mid")).unwrap();
    assert_eq!(std::fs::read_dir(a.path("top/mid")).unwrap().count(), 0);
    let recalls = || metric(&c.server.addr, "kt_watch_recalls_total");
    let (told, asked) = (
        recalls(),
        metric(&agent, "kt_mount_metadata_requests_total"),
    );
    for i in 0..30 {
        std::fs::create_dir(a.path(&format!("top/mid/d{i}"))).unwrap();
    }
    // B never looked below the root: no one else holds what these change.
    assert_eq!(recalls() - told, 0.0, "A was told of its own mkdirs");
    let asked = metric(&agent, "kt_mount_metadata_requests_total") - asked;
    assert!(asked <= 40.0, "{asked} metadata requests for 30 mkdirs");
    // A lists them from what the answers carried; B, asking, sees the same.
    let names = |m: &MountProc| {
        let mut v: Vec<String> = std::fs::read_dir(m.path("top/mid"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&a).len(), 30);
    assert_eq!(names(&a), names(&b));
    // The parent's link count counts them.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(a.path("top/mid")).unwrap().nlink(), 32);
    // Nor of its own renames, chmods and removals: the kernel holds the directory for most of
    // them, and a mount told of one would wait to have the kernel forget its names. (A hard
    // link's changes are told to everyone as changes of everything: its other names moved.)
    std::fs::create_dir_all(a.path("own/sub")).unwrap();
    for i in 0..5 {
        std::fs::write(a.path(&format!("own/sub/f{i}")), b"x").unwrap();
    }
    let told = recalls();
    for i in 0..5 {
        let (f, g) = (format!("own/sub/f{i}"), format!("own/sub/g{i}"));
        std::fs::rename(a.path(&f), a.path(&g)).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o600);
        std::fs::set_permissions(a.path(&g), mode).unwrap();
        std::fs::remove_file(a.path(&g)).unwrap();
    }
    assert_eq!(recalls() - told, 0.0, "A was told of its own changes");
    // A hard link's change is told to everyone as a change of everything, its maker too,
    // which does not wait for the kernel to forget its names (its link holds the directory
    // until the change is acknowledged).
    for i in 0..10 {
        std::fs::write(a.path(&format!("own/h{i}")), b"y").unwrap();
        std::fs::hard_link(a.path(&format!("own/h{i}")), a.path(&format!("own/l{i}"))).unwrap();
    }
    std::fs::remove_dir(a.path("own/sub")).unwrap();
    let waits = metric(&agent, "kt_mount_kernel_forget_waits_total");
    assert_eq!(waits, 0.0, "A waited on its own requests");
    // And a mkdir on B, which now holds the directory, still reaches A.
    std::fs::create_dir(b.path("top/mid/from-b")).unwrap();
    assert!(a.path("top/mid/from-b").is_dir());
    assert_eq!(metric(&c.server.addr, "kt_watch_lapsed_total"), 0.0);
}

/// A reader going through a directory of small files waits for the store once: soon after
/// it enters a batch resolved ahead, the mount asks for the next one in the background, so the
/// opens at each batch's end find their versions kept.
#[test]
fn the_next_batch_of_small_files_is_resolved_before_the_reader_reaches_it() {
    let (_c, a, b) = two_nodes("127.0.0.8", "127.0.0.10");
    let agent = b.proc.as_ref().expect("running").addr.clone();
    std::fs::create_dir(a.path("many")).unwrap();
    let body = |i: usize| format!("file {i:03} ").repeat(100);
    for i in 0..200 {
        std::fs::write(a.path(&format!("many/f{i:03}")), body(i)).unwrap();
    }
    assert_eq!(std::fs::read_dir(b.path("many")).unwrap().count(), 200);
    let waited = || metric(&agent, "kt_mount_open_resolves_total");
    let ahead = || metric(&agent, "kt_mount_resolved_ahead_total");
    let (waited0, ahead0) = (waited(), ahead());
    let read = |range: std::ops::Range<usize>| {
        for i in range {
            let f = b.path(&format!("many/f{i:03}"));
            assert_eq!(std::fs::read_to_string(f).unwrap(), body(i), "f{i:03}");
        }
    };
    // The first open resolves 64 files; the 5th asks for the next 64 in the background, and
    // so on: each batch is waited for here before the reader reaches it, as a reader slower
    // than one round trip per batch would find it.
    for (files, batches) in [(0..40, 1.0), (40..110, 2.0), (110..170, 3.0)] {
        read(files);
        assert!(
            eventually(Duration::from_secs(10), || ahead() - ahead0 >= batches),
            "batch {batches} was not resolved ahead"
        );
    }
    read(170..200);
    assert_eq!(waited() - waited0, 1.0, "opens that waited for a resolve");
    // A reader going straight through asks once too (one that reaches a batch still under way
    // waits for it).
    std::fs::create_dir(a.path("again")).unwrap();
    for i in 0..200 {
        std::fs::write(a.path(&format!("again/f{i:03}")), body(i)).unwrap();
    }
    assert_eq!(std::fs::read_dir(b.path("again")).unwrap().count(), 200);
    let waited0 = waited();
    for i in 0..200 {
        let f = b.path(&format!("again/f{i:03}"));
        assert_eq!(std::fs::read_to_string(f).unwrap(), body(i), "f{i:03}");
    }
    assert_eq!(waited() - waited0, 1.0, "opens that asked again");
}

/// A mount reading a directory of small files it never opened asks for their versions a
/// batch at a time (an open resolves, with its own file, the small files after it, their bytes
/// inline), and a file changed on another node after it was resolved ahead, but before it was
/// opened here, still opens as its new version.
#[test]
fn a_mount_reading_a_directory_of_small_files_resolves_them_a_batch_at_a_time() {
    let (c, a, b) = two_nodes("127.0.0.235", "127.0.0.236");
    let agent = b.proc.as_ref().expect("running").addr.clone();
    let writer = a.proc.as_ref().expect("running").addr.clone();
    let flushes = |addr: &str| metric(addr, "kt_fuse_op_seconds_count{op=\"flush\"}");
    let written = flushes(&writer);
    std::fs::create_dir(a.path("small")).unwrap();
    let body = |i: usize, what: &str| format!("{what} {i:03} ").repeat(200);
    for i in 0..100 {
        std::fs::write(a.path(&format!("small/f{i:03}")), body(i, "first")).unwrap();
    }
    // A writer's close reaches the mount (it publishes there); a reader's does not (the
    // kernel was told FOPEN_NOFLUSH: one request less per file read).
    assert!(flushes(&writer) - written >= 100.0);
    let read = flushes(&agent);
    assert_eq!(std::fs::read_dir(b.path("small")).unwrap().count(), 100);
    let before = metric(&agent, "kt_mount_metadata_requests_total");
    assert_eq!(
        std::fs::read_to_string(b.path("small/f000")).unwrap(),
        body(0, "first")
    );
    // f010 was resolved ahead with f000; it changes before B opens it.
    std::fs::write(a.path("small/f010"), body(10, "second")).unwrap();
    for i in 1..100 {
        let want = if i == 10 { "second" } else { "first" };
        assert_eq!(
            std::fs::read_to_string(b.path(&format!("small/f{i:03}"))).unwrap(),
            body(i, want),
            "f{i:03}"
        );
    }
    let asked = metric(&agent, "kt_mount_metadata_requests_total") - before;
    assert!(
        asked <= 10.0,
        "{asked} metadata requests to read 100 small files"
    );
    assert_eq!(
        flushes(&agent),
        read,
        "a reader's close was sent to the mount"
    );
    assert_eq!(metric(&c.server.addr, "kt_watch_lapsed_total"), 0.0);
}

/// A first walk of a tree another node wrote (ls -R, find): each listing brings those the
/// walk reads next, so B asks a few times for 81 directories, and a directory listed ahead
/// that changes before the walk reaches it is seen as it is then.
#[test]
fn a_first_walk_of_a_tree_asks_for_many_directories_at_once_and_sees_later_changes() {
    let (_c, a, b) = two_nodes("127.0.0.244", "127.0.0.249");
    let agent = b.proc.as_ref().expect("running").addr.clone();
    let mut want = Vec::new();
    for d in 0..40 {
        for f in 0..3 {
            want.push((format!("tree/d{d:02}/f{f}"), (d * 3 + f) as u64));
        }
        want.push((format!("tree/d{d:02}/e/deep"), 7));
    }
    for (name, size) in &want {
        let path = a.path(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, vec![b'x'; *size as usize]).unwrap();
    }
    // B's first look at the top brings the directories below it.
    let before = metric(&agent, "kt_mount_metadata_requests_total");
    assert_eq!(std::fs::read_dir(b.path("tree")).unwrap().count(), 40);
    // d30 was listed ahead; it changes before the walk gets there.
    std::fs::write(a.path("tree/d30/late"), b"late").unwrap();
    want.push(("tree/d30/late".into(), 4));
    want.sort();
    let mut found = Vec::new();
    let mut dirs = vec![b.path("tree")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                dirs.push(e.path());
            } else {
                let rel = e.path().strip_prefix(b.path("")).unwrap().to_owned();
                found.push((rel.to_string_lossy().into_owned(), m.len()));
            }
        }
    }
    found.sort();
    assert_eq!(found, want);
    let asked = metric(&agent, "kt_mount_metadata_requests_total") - before;
    assert!(
        asked <= 12.0,
        "{asked} metadata requests to walk 81 directories"
    );
}

/// `ls -l` of a directory another node wrote: the listing comes with every name's attributes
/// (READDIRPLUS), so the kernel looks none of the names up, and the sizes are right.
#[test]
fn a_listing_brings_its_names_attributes_so_ls_l_looks_none_up() {
    let (_c, a, b) = two_nodes("127.0.0.238", "127.0.0.239");
    let agent = b.proc.as_ref().expect("running").addr.clone();
    std::fs::create_dir(a.path("listed")).unwrap();
    for i in 0..50 {
        std::fs::write(a.path(&format!("listed/f{i:02}")), vec![b'x'; i]).unwrap();
    }
    // B looks the directory itself up first; from here on only its names are counted.
    assert!(b.path("listed").is_dir());
    let looked_up = || metric(&agent, "kt_fuse_op_seconds_count{op=\"lookup\"}");
    let (before, listed) = (
        looked_up(),
        metric(&agent, "kt_mount_readdirplus_names_total"),
    );
    let mut sizes: Vec<(String, u64)> = std::fs::read_dir(b.path("listed"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            (e.file_name().into_string().unwrap(), m.len())
        })
        .collect();
    sizes.sort();
    let want: Vec<(String, u64)> = (0..50).map(|i| (format!("f{i:02}"), i as u64)).collect();
    assert_eq!(sizes, want);
    assert_eq!(looked_up() - before, 0.0, "the kernel looked names up");
    assert!(metric(&agent, "kt_mount_readdirplus_names_total") - listed >= 50.0);
}

/// The kernel keeps names it looked up for as long as the mount's lease holds (not a second), so
/// a change told by the watch must reach the kernel's names too: a file that becomes a
/// directory on another node is a directory here at once (a stale name would make it a file
/// whose attributes say directory, which the kernel answers with EIO), and a name removed there
/// is gone here, however long ago this node looked it up.
#[test]
fn the_kernel_forgets_a_name_another_node_changed_whatever_its_ttl() {
    let (_c, a, b) = two_nodes("127.0.0.112", "127.0.0.113");
    std::fs::create_dir(a.path("t")).unwrap();
    for round in 0..5 {
        let x = format!("t/x{round}");
        std::fs::write(a.path(&x), b"a file").unwrap();
        // B looks it up: the kernel holds the name now.
        assert!(std::fs::metadata(b.path(&x)).unwrap().is_file());
        std::fs::remove_file(a.path(&x)).unwrap();
        std::fs::create_dir(a.path(&x)).unwrap();
        std::fs::write(a.path(&format!("{x}/y")), b"inside").unwrap();
        let meta = std::fs::metadata(b.path(&x)).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(meta.is_dir(), "round {round}: still a file");
        assert_eq!(
            std::fs::read(b.path(&format!("{x}/y"))).unwrap(),
            b"inside",
            "round {round}"
        );
    }
    // Looked up long before (past the old one-second TTL), then removed there.
    std::fs::write(a.path("t/old"), b"old").unwrap();
    assert!(std::fs::metadata(b.path("t/old")).is_ok());
    std::thread::sleep(Duration::from_millis(1500));
    assert!(std::fs::metadata(b.path("t/old")).is_ok());
    std::fs::remove_file(a.path("t/old")).unwrap();
    assert!(std::fs::metadata(b.path("t/old")).is_err());
}

/// `kt mount --stale-reads`: with no store server reachable, the mount goes on reading what it
/// holds (the listings and versions it last saw, the blocks it cached) and refuses writes with
/// EROFS; once a server answers again, writes go through.
#[test]
fn a_mount_with_stale_reads_reads_what_it_holds_while_no_server_answers() {
    let ip = "127.0.0.9";
    let Cluster { dir, server, .. } = Cluster::new(ip);
    let addr = server.addr.clone();
    let a = start_mount(
        ip,
        &addr,
        &dir.path().join("a"),
        "stale-a",
        &["--stale-reads"],
    );
    std::fs::create_dir(a.path("d")).unwrap();
    let big = pseudo_random(3 << 20, 5);
    std::fs::write(a.path("d/small"), b"small\n").unwrap();
    std::fs::write(a.path("d/big"), &big).unwrap();
    let names = || {
        let mut v: Vec<String> = std::fs::read_dir(a.path("d"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(std::fs::read(a.path("d/small")).unwrap(), b"small\n");
    assert!(std::fs::read(a.path("d/big")).unwrap() == big);
    assert_eq!(names(), ["big", "small"]);

    server.kill();
    let refused = || {
        std::fs::create_dir(a.path("probe"))
            .err()
            .and_then(|e| e.raw_os_error())
            == Some(libc::EROFS)
    };
    assert!(
        eventually(Duration::from_secs(10), refused),
        "writes were not refused with the server gone"
    );
    // Past every lease and listing lifetime: what it holds, as it last saw it.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(names(), ["big", "small"]);
    assert_eq!(std::fs::read(a.path("d/small")).unwrap(), b"small\n");
    assert!(std::fs::read(a.path("d/big")).unwrap() == big);
    assert_eq!(
        std::fs::metadata(a.path("d/big")).unwrap().len(),
        big.len() as u64
    );
    let write = std::fs::write(a.path("d/new"), b"x").unwrap_err();
    assert_eq!(write.raw_os_error(), Some(libc::EROFS), "{write}");

    // The server is back (the same data directory and address): writes go through again.
    let store = dir.path().join("store");
    let _server = spawn_ready(&[
        "server",
        "--listen",
        &addr,
        "--data-dir",
        store.to_str().unwrap(),
        "--lease-secs",
        "10",
    ]);
    assert!(
        eventually(Duration::from_secs(20), || std::fs::write(
            a.path("d/after"),
            b"back\n"
        )
        .is_ok()),
        "writes stayed refused with the server back"
    );
    assert_eq!(std::fs::read(a.path("d/after")).unwrap(), b"back\n");
}
