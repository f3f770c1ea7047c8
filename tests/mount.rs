//! The filesystem at /kt, mounted for real: two agents on their own addresses with their own
//! caches and mountpoints, driven with ordinary tools (cp, mv, rm, dd, python's mmap, git).
//! These tests need /dev/fuse and root; they never skip themselves.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use common::*;

const MIB: usize = 1 << 20;
const SETTLE: Duration = Duration::from_secs(10);

fn tree(root: &std::path::Path) {
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("config.json"), br#"{"k": 1}"#).unwrap();
    fs::write(root.join("zero"), b"").unwrap();
    fs::write(root.join("a/weights.bin"), pseudo_random(9 * MIB + 17, 5)).unwrap();
    fs::write(root.join("a/b/c/ünïcødé.txt"), "ü\n").unwrap();
    fs::write(root.join("run.sh"), b"#!/bin/sh\n").unwrap();
    fs::set_permissions(root.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("a/weights.bin", root.join("link")).unwrap();
}

#[test]
fn tree_copied_into_one_mount_reads_back_through_another() {
    let c = Cluster::new("127.0.0.81");
    let a = start_mount("127.0.0.82", &c.server.addr, &c.path("a"), "node-a", &[]);
    let b = start_mount("127.0.0.83", &c.server.addr, &c.path("b"), "node-b", &[]);
    let src = c.path("src/ckpt");
    tree(&src);
    fs::create_dir(a.path("my-svc")).unwrap();
    sh(&format!(
        "cp -r {} {}",
        src.display(),
        a.path("my-svc/ckpt-100").display()
    ));
    // Visible to the CLI and to the other mount, byte for byte.
    let ls = c.json(None, &["ls", "my-svc/ckpt-100"]);
    let names = ls_names(&ls);
    assert_eq!(
        names,
        ["a/", "config.json", "empty/", "link", "run.sh", "zero"]
    );
    assert_same_tree(&src, &b.path("my-svc/ckpt-100"));
    assert_eq!(
        fs::metadata(b.path("my-svc/ckpt-100/run.sh"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );

    // B read the blocks, so B is now a source: a getter is served by node-b before the store.
    let dest = c.path("from-b.bin");
    let served_by_b = eventually(SETTLE, || {
        let _ = fs::remove_file(&dest);
        let got = c.json(
            None,
            &[
                "get",
                "my-svc/ckpt-100/a/weights.bin",
                "--dest",
                dest.to_str().unwrap(),
            ],
        );
        got["sources"][0]["source"] == "node-b"
    });
    assert!(served_by_b, "the reading node did not become a source");
    assert!(fs::read(&dest).unwrap() == fs::read(src.join("a/weights.bin")).unwrap());

    // mv is a metadata rename, visible on the other mount once its metadata cache expires.
    sh(&format!(
        "mv {} {}",
        a.path("my-svc/ckpt-100").display(),
        a.path("my-svc/final").display()
    ));
    assert!(!a.path("my-svc/ckpt-100").exists());
    assert_same_tree(&src, &a.path("my-svc/final"));
    assert!(eventually(SETTLE, || b
        .path("my-svc/final/config.json")
        .exists()));
    assert!(eventually(SETTLE, || !b.path("my-svc/ckpt-100").exists()));

    // rm -r removes the whole tree.
    sh(&format!("rm -r {}", a.path("my-svc/final").display()));
    assert!(fs::read_dir(a.path("my-svc")).unwrap().next().is_none());
    assert!(eventually(SETTLE, || !b.path("my-svc/final").exists()));
    let ls = c.json(None, &["ls", "-r"]);
    assert!(!ls.to_string().contains("final"), "{ls}");
}

#[test]
fn close_to_open_and_attributes_after_changes() {
    let c = Cluster::new("127.0.0.84");
    let a = start_mount("127.0.0.85", &c.server.addr, &c.path("a"), "node-a", &[]);
    let b = start_mount("127.0.0.86", &c.server.addr, &c.path("b"), "node-b", &[]);
    let fa = a.path("notes.txt");
    fs::write(&fa, b"version one").unwrap();
    assert_eq!(fs::read(b.path("notes.txt")).unwrap(), b"version one");
    // Same size, new bytes: a reader that opens after the writer closed sees them.
    fs::write(&fa, b"version two").unwrap();
    assert_eq!(fs::read(b.path("notes.txt")).unwrap(), b"version two");

    // What this mount changed, it reports at once: size, mode, mtime.
    let mut f = fs::OpenOptions::new().append(true).open(&fa).unwrap();
    f.write_all(b", longer").unwrap();
    drop(f);
    assert_eq!(fs::metadata(&fa).unwrap().len(), 19);
    assert_eq!(fs::read(&fa).unwrap(), b"version two, longer");
    fs::set_permissions(&fa, fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        fs::metadata(&fa).unwrap().permissions().mode() & 0o777,
        0o600
    );
    sh(&format!("touch -d '2020-01-02 03:04:05' {}", fa.display()));
    let m = fs::metadata(&fa).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(m.mtime(), 1_577_934_245);
    sh(&format!("truncate -s 7 {}", fa.display()));
    assert_eq!(fs::read(&fa).unwrap(), b"version");
    assert!(eventually(SETTLE, || fs::read(b.path("notes.txt"))
        .unwrap()
        == b"version"));

    // Directories, symlinks and the errors a user expects.
    fs::create_dir(a.path("d")).unwrap();
    assert_eq!(
        fs::create_dir(a.path("d")).unwrap_err().raw_os_error(),
        Some(libc::EEXIST)
    );
    fs::write(a.path("d/x"), b"x").unwrap();
    assert_eq!(
        fs::remove_dir(a.path("d")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    assert_eq!(
        fs::remove_file(a.path("d")).unwrap_err().raw_os_error(),
        Some(libc::EISDIR)
    );
    std::os::unix::fs::symlink("d/x", a.path("lnk")).unwrap();
    assert_eq!(fs::read_link(a.path("lnk")).unwrap().to_str(), Some("d/x"));
    assert_eq!(fs::read(a.path("lnk")).unwrap(), b"x");
    fs::hard_link(a.path("d/x"), a.path("hard")).unwrap();
    assert_eq!(fs::read(a.path("hard")).unwrap(), b"x");
    let st = sh(&format!("stat -f -c %b {}", a.mountpoint.display()));
    assert!(
        st.trim().parse::<u64>().unwrap() > 0,
        "statfs reports no space"
    );
    fs::remove_file(a.path("d/x")).unwrap();
    fs::remove_dir(a.path("d")).unwrap();
    assert!(!a.path("d").exists());
}

#[test]
fn locale_xattr_keeps_files_on_the_writer() {
    let c = Cluster::new("127.0.0.87");
    let a = start_mount("127.0.0.88", &c.server.addr, &c.path("a"), "node-a", &[]);
    let b = start_mount("127.0.0.89", &c.server.addr, &c.path("b"), "node-b", &[]);
    fs::create_dir(a.path("scratch")).unwrap();
    sh(&format!(
        "setfattr -n user.kt.locale -v local {}",
        a.path("scratch").display()
    ));
    assert!(sh(&format!(
        "getfattr -n user.kt.locale {}",
        a.path("scratch").display()
    ))
    .contains("local"));
    let data = pseudo_random(5 * MIB, 9);
    fs::write(a.path("scratch/local.bin"), &data).unwrap();
    fs::write(a.path("stored.bin"), b"to the store").unwrap();
    let ls = c.json(None, &["ls", "scratch"]);
    assert_eq!(ls[0]["locale"], "node-a", "{ls}");
    assert_eq!(
        c.json(None, &["ls"])
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "stored.bin")
            .unwrap()["locale"],
        "store"
    );
    // The other node reads it from node-a, in place.
    assert!(fs::read(b.path("scratch/local.bin")).unwrap() == data);
    let bad = Command::new("setfattr")
        .args(["-n", "user.kt.locale", "-v", "elsewhere"])
        .arg(a.path("scratch"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
}

#[test]
fn git_works_inside_the_mount() {
    let c = Cluster::new("127.0.0.90");
    let a = start_mount("127.0.0.91", &c.server.addr, &c.path("a"), "node-a", &[]);
    let repo = a.path("repo");
    fs::create_dir(&repo).unwrap();
    let git = |args: &str| {
        sh(&format!(
            "cd {} && git -c user.email=t@t -c user.name=t {args}",
            repo.display()
        ))
    };
    git("init -q");
    fs::write(repo.join("main.rs"), b"fn main() {}\n").unwrap();
    fs::create_dir(repo.join("src")).unwrap();
    fs::write(repo.join("src/lib.rs"), b"pub fn f() {}\n").unwrap();
    git("add -A");
    git("commit -qm first");
    fs::write(repo.join("main.rs"), b"fn main() { println!(); }\n").unwrap();
    git("commit -qam second");
    assert_eq!(git("log --oneline").lines().count(), 2);
    assert!(git("status --porcelain").trim().is_empty());
    git("fsck --strict");
}

#[test]
fn read_only_mount_refuses_writes() {
    let c = Cluster::new("127.0.0.92");
    let f = c.path("f");
    fs::write(&f, b"published").unwrap();
    c.ok(None, &["put", "f", "--src", f.to_str().unwrap()]);
    let a = start_mount(
        "127.0.0.93",
        &c.server.addr,
        &c.path("a"),
        "node-a",
        &["--read-only"],
    );
    assert_eq!(fs::read(a.path("f")).unwrap(), b"published");
    for err in [
        fs::write(a.path("new"), b"x").unwrap_err(),
        fs::OpenOptions::new()
            .write(true)
            .open(a.path("f"))
            .unwrap_err(),
        fs::create_dir(a.path("d")).unwrap_err(),
        fs::remove_file(a.path("f")).unwrap_err(),
    ] {
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    }
}

#[test]
fn large_file_by_dd_and_mmap_crash_safe_cache_and_cache_reuse() {
    let c = Cluster::new("127.0.0.94");
    // In place on A: the only source of the blocks besides B's own cache.
    let a = start_mount(
        "127.0.0.95",
        &c.server.addr,
        &c.path("a"),
        "node-a",
        &["--locale", "local"],
    );
    let mut b = start_mount("127.0.0.96", &c.server.addr, &c.path("b"), "node-b", &[]);
    let src = c.path("big.bin");
    sh(&format!("head -c 1G /dev/urandom > {}", src.display()));
    let want = sh(&format!("sha256sum < {}", src.display()));
    sh(&format!(
        "dd if={} of={} bs=4M status=none",
        src.display(),
        a.path("big.bin").display()
    ));

    // B dies in the middle of a cold read, while blocks are being fetched into its cache.
    let mut reader = fs::File::open(b.path("big.bin")).unwrap();
    let mut chunk = vec![0u8; 64 * MIB];
    reader.read_exact(&mut chunk).unwrap();
    assert!(chunk[..] == std::fs::read(&src).unwrap()[..64 * MIB]);
    b.crash();
    assert!(reader.read_exact(&mut chunk).is_err());
    drop(reader);

    // Restarted on the same cache: reads are right, with dd and through mmap.
    let b = start_mount("127.0.0.96", &c.server.addr, &c.path("b"), "node-b", &[]);
    let got = sh(&format!(
        "dd if={} bs=1M status=none | sha256sum",
        b.path("big.bin").display()
    ));
    assert_eq!(got, want, "wrong bytes after a crash of the reader's agent");
    let py = format!(
        "import mmap,hashlib\nf=open('{}','rb')\nm=mmap.mmap(f.fileno(),0,prot=mmap.PROT_READ)\nprint(hashlib.sha256(m).hexdigest()+'  -')",
        b.path("big.bin").display()
    );
    assert_eq!(sh(&format!("python3 -c \"{py}\"")), want);

    // With the only other source gone, B reads the whole file again from its own cache.
    drop(a);
    sh("echo 3 > /proc/sys/vm/drop_caches");
    let got = sh(&format!(
        "dd if={} bs=1M iflag=direct status=none | sha256sum",
        b.path("big.bin").display()
    ));
    assert_eq!(
        got, want,
        "a cached file needed the network the second time"
    );
}

#[test]
fn dead_source_during_read_is_an_error_not_a_hang() {
    let c = Cluster::new("127.0.0.97");
    let mut a = start_mount(
        "127.0.0.98",
        &c.server.addr,
        &c.path("a"),
        "node-a",
        &["--locale", "local"],
    );
    let b = start_mount("127.0.0.99", &c.server.addr, &c.path("b"), "node-b", &[]);
    fs::write(a.path("only-on-a.bin"), pseudo_random(12 * MIB, 4)).unwrap();
    assert!(b.path("only-on-a.bin").exists());
    a.crash();
    let start = std::time::Instant::now();
    let mut buf = Vec::new();
    let err = fs::File::open(b.path("only-on-a.bin"))
        .and_then(|mut f| f.read_to_end(&mut buf))
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30), "the read hung");
}

/// A small file in the store comes with its `open` (the resolve carries its bytes), so reading
/// it needs nothing more from the store: here the store is stopped between the open and the
/// read. Without the inline bytes the read would wait on the stopped store's data plane.
#[test]
fn a_small_file_comes_with_its_open() {
    let c = Cluster::new("127.0.0.102");
    let a = start_mount("127.0.0.103", &c.server.addr, &c.path("a"), "node-a", &[]);
    let b = start_mount("127.0.0.104", &c.server.addr, &c.path("b"), "node-b", &[]);
    let data = pseudo_random(5000, 21);
    fs::write(a.path("small.txt"), &data).unwrap();
    let mut f = fs::File::open(b.path("small.txt")).unwrap();
    let server = c.server.child.id() as i32;
    signal(server, libc::SIGSTOP);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = tx.send(f.read_to_end(&mut buf).map(|_| buf));
    });
    let got = rx.recv_timeout(Duration::from_secs(10));
    signal(server, libc::SIGCONT);
    let got = got.expect("the read waited for the stopped store").unwrap();
    assert!(got == data, "the small file read back different");
}

#[test]
fn unmount_with_open_files_keeps_published_data() {
    let c = Cluster::new("127.0.0.100");
    let a = start_mount("127.0.0.101", &c.server.addr, &c.path("a"), "node-a", &[]);
    let mut f = fs::File::create(a.path("open.txt")).unwrap();
    f.write_all(b"still open at unmount").unwrap();
    fs::write(a.path("closed.txt"), b"closed before").unwrap();
    // SIGTERM while the file is open: the agent unmounts (lazily if it must) and publishes.
    drop(a);
    drop(f);
    let out = c.path("out");
    c.ok(None, &["get", "open.txt", "--dest", out.to_str().unwrap()]);
    assert_eq!(fs::read(&out).unwrap(), b"still open at unmount");
    let out2 = c.path("out2");
    c.ok(
        None,
        &["get", "closed.txt", "--dest", out2.to_str().unwrap()],
    );
    assert_eq!(fs::read(&out2).unwrap(), b"closed before");
}

/// A FLUSH may come in the middle of a write: every process forked while a file is open closes
/// its copy of the descriptor at exec, and the kernel sends FLUSH for it. What is written while
/// that publish runs must still be published by the final close.
#[test]
fn writes_during_a_publish_from_a_forked_childs_flush_are_not_lost() {
    let c = Cluster::new("127.0.0.110");
    let a = start_mount("127.0.0.111", &c.server.addr, &c.path("a"), "node-a", &[]);
    let chunk = pseudo_random(256 << 10, 9);
    for round in 0..6 {
        let name = format!("f{round}.bin");
        let path = a.path(&name);
        let mut f = fs::File::create(&path).unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Forks and execs while the file is open, so flushes interleave with the writes.
        let forker = {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut n = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) && n < 200 {
                    let _ = Command::new("true").status();
                    n += 1;
                }
            })
        };
        for _ in 0..16 {
            f.write_all(&chunk).unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        forker.join().unwrap();
        drop(f);
        let ls = c.json(None, &["ls", &name]);
        assert_eq!(
            ls[0]["size"].as_u64(),
            Some(16 * chunk.len() as u64),
            "round {round}: the last close did not publish everything: {ls}"
        );
        assert_eq!(fs::metadata(&path).unwrap().len(), 16 * chunk.len() as u64);
    }
}

/// Readers through the mount take their parent from the version's window like `kt get` does:
/// with one child per source, a second reader goes elsewhere instead of piling onto the peer
/// that already serves one.
#[test]
fn mount_readers_spread_over_sources_within_the_fanout() {
    let c = Cluster::new("127.0.0.120");
    let f = c.path("w.src");
    let data = pseudo_random(4 * MIB, 21);
    fs::write(&f, &data).unwrap();
    let put = c.json(
        None,
        &[
            "put",
            "w",
            "--src",
            f.to_str().unwrap(),
            "--block-size",
            "1048576",
        ],
    );
    let group = format!("v-{}", &put["version"].as_str().unwrap()[..16]);
    let one = ["--fanout", "1"];
    let a = start_mount("127.0.0.121", &c.server.addr, &c.path("a"), "node-a", &one);
    let b = start_mount("127.0.0.122", &c.server.addr, &c.path("b"), "node-b", &one);
    let cc = start_mount("127.0.0.123", &c.server.addr, &c.path("c"), "node-c", &one);
    // A reads it all: it is a source now.
    assert!(fs::read(a.path("w")).unwrap() == data);
    assert!(eventually(SETTLE, || {
        c.json(
            None,
            &[
                "get",
                "w",
                "-d",
                c.path("probe").to_str().unwrap(),
                "-f",
                "--no-seed-data",
            ],
        )["sources"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x["source"] == "node-a"))
    }));
    // B and C keep the file open; B takes A, and C, with A full, takes the store.
    let hold = |m: &MountProc| {
        let mut child = Command::new("python3")
            .arg("-c")
            .arg("import sys; f = open(sys.argv[1], 'rb'); f.read(1); print('open', flush=True); sys.stdin.read(); sys.stdout.write(str(len(f.read()) + 1))")
            .arg(m.path("w"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "open");
        child
    };
    let hb = hold(&b);
    let hc = hold(&cc);
    let w = c.json(None, &["window", &group]);
    let parents: Vec<(&str, &str)> = w["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["done"] == false && m["failed"] == false)
        .map(|m| {
            (
                m["node_id"].as_str().unwrap(),
                m["parent"].as_str().unwrap(),
            )
        })
        .collect();
    // B took A; C, with A full, took another source (B itself, a source once it read, or the
    // store): never a second child of A.
    assert!(parents.contains(&("node-b", "node-a")), "{w}");
    let of_c = parents
        .iter()
        .find(|(n, _)| *n == "node-c")
        .map(|(_, p)| *p);
    assert!(matches!(of_c, Some("node-b" | "store")), "{w}");
    for h in [hb, hc] {
        let out = h.wait_with_output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim_start_matches("open\n"),
            (4 * MIB).to_string()
        );
    }
    assert!(fs::read(b.path("w")).unwrap() == data);
    assert!(fs::read(cc.path("w")).unwrap() == data);
}

/// Pages of the file behind `f` that sit in the page cache, and the file's bytes seen through
/// a shared read-only mapping of it.
fn resident_and_mapped(f: &fs::File, len: usize) -> (usize, Vec<u8>) {
    use std::os::fd::AsRawFd;
    let mut vec = vec![0u8; len.div_ceil(4096)];
    // SAFETY: a read-only mapping of `len` bytes of an open file, unmapped before return;
    // mincore writes one byte per page into `vec`, which has that many; the slice is copied
    // out while the mapping lives.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(libc::mincore(p, len, vec.as_mut_ptr()), 0);
        let resident = vec.iter().filter(|&&b| b & 1 == 1).count();
        let mapped = std::slice::from_raw_parts(p as *const u8, len).to_vec();
        libc::munmap(p, len);
        (resident, mapped)
    }
}

#[test]
fn a_large_file_read_the_first_time_streams_past_the_page_cache() {
    let c = Cluster::new("127.0.0.105");
    let a = start_mount("127.0.0.106", &c.server.addr, &c.path("a"), "node-a", &[]);
    let b = start_mount("127.0.0.107", &c.server.addr, &c.path("b"), "node-b", &[]);
    let big = pseudo_random(80 * MIB + 123, 31);
    let small = pseudo_random(8 * MIB, 32);
    fs::write(a.path("big.bin"), &big).unwrap();
    fs::write(a.path("small.bin"), &small).unwrap();
    for (name, want, bypass) in [("big.bin", &big, true), ("small.bin", &small, false)] {
        let mut f = fs::File::open(b.path(name)).unwrap();
        let mut got = Vec::new();
        f.read_to_end(&mut got).unwrap();
        assert!(got == *want, "{name} read back different");
        let (resident, mapped) = resident_and_mapped(&f, want.len());
        if bypass {
            assert_eq!(resident, 0, "reading {name} filled the page cache");
        } else {
            assert!(resident > 0, "{name} was not read through the page cache");
        }
        assert!(mapped == *want, "{name} mapped different");
    }
    // The next open of the same version keeps what the mapping brought into the page cache.
    let f = fs::File::open(b.path("big.bin")).unwrap();
    let (resident, mapped) = resident_and_mapped(&f, big.len());
    assert!(resident > 0);
    assert!(mapped == big);
}

/// Every file under `dirs` that user nobody (65534) can open for reading.
fn readable_by_nobody(dirs: &[&std::path::Path]) -> Vec<String> {
    use std::os::unix::process::CommandExt;
    let files: Vec<String> = dirs
        .iter()
        .flat_map(|d| walk(d))
        .filter(|p| p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    assert!(!files.is_empty(), "nothing on disk under {dirs:?}");
    let out = Command::new("sh")
        .args([
            "-c",
            r#"for f in "$@"; do cat -- "$f" >/dev/null 2>&1 && echo "$f"; done; true"#,
            "sh",
        ])
        .args(&files)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

/// A file written 0600 through a mount is staged, cached and stored on disks where other local
/// users live: none of them may read it there (the daemons' directories are 0700 and their
/// files 0600), while it is open and after its publish.
#[test]
fn what_a_mount_and_the_store_keep_on_disk_no_other_user_reads() {
    use std::os::unix::fs::OpenOptionsExt;
    let c = Cluster::new("127.0.0.28");
    // Where a daemon's directory usually is, its parents are open to everyone.
    fs::set_permissions(c.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let m = start_mount("127.0.0.28", &c.server.addr, &c.path("a"), "n28", &[]);
    let secret = pseudo_random(300_000, 28);
    let path = m.path("secret.bin");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .unwrap();
    f.write_all(&secret).unwrap();
    // Open, it is staged on the node.
    let store = c.path("store");
    let cache = m.dir.join("cache");
    let found = readable_by_nobody(&[&cache, &store]);
    assert!(found.is_empty(), "another user reads: {found:?}");
    drop(f);
    // Closed, it is published: a block file on the store, and cached on the node once read.
    assert_eq!(fs::read(&path).unwrap(), secret);
    let on_disk = walk(&store)
        .into_iter()
        .chain(walk(&cache))
        .filter(|p| p.is_file())
        .any(|p| fs::read(&p).is_ok_and(|b| b == secret));
    assert!(
        on_disk,
        "the bytes are nowhere on disk: the check would prove nothing"
    );
    let found = readable_by_nobody(&[&cache, &store]);
    assert!(found.is_empty(), "another user reads: {found:?}");
}
