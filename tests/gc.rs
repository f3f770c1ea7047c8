//! Garbage collection on a real store server: after cycles of put, replace and rm, the disk
//! its blocks take returns to what the live keys need, and the live keys still read whole.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use ktfs::dataplane::wire;
use ktfs::hash::BlockHash;

/// Bytes of the block files under `dir`.
fn block_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for fan in std::fs::read_dir(dir).unwrap().flatten() {
        if let Ok(files) = std::fs::read_dir(fan.path()) {
            for f in files.flatten() {
                total += f.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    total
}

/// A store server on `ip` that collects garbage every second.
fn gc_server(ip: &str, store: &Path) -> test_support::Proc {
    spawn_ready(&[
        "server",
        "--listen",
        &format!("{ip}:0"),
        "--data-dir",
        store.to_str().unwrap(),
        "--gc-interval-secs",
        "1",
    ])
}

/// `kt ARGS` against `server`, which must succeed.
#[track_caller]
fn ok_kt(server: &test_support::Proc, agent_sock: &Path, args: &[&str]) {
    let out = kt_with(&server.addr, agent_sock, args);
    assert!(
        out.status.success(),
        "kt {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn disk_use_returns_to_what_live_keys_need_after_puts_and_removals() {
    let ip = "127.0.0.190";
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let server = gc_server(ip, &store);
    let none = dir.path().join("no-agent.sock");
    let kt = |args: &[&str]| ok_kt(&server, &none, args);
    let write = |name: &str, len: usize, seed: u64| {
        let p = dir.path().join(name);
        std::fs::write(&p, pseudo_random(len, seed)).unwrap();
        p.to_str().unwrap().to_string()
    };
    let blocks = store.join("blocks");
    let keep = write("keep.bin", (5 << 20) + 3, 1);
    kt(&["put", "keep", "--src", &keep]);
    let baseline = block_bytes(&blocks);
    assert!(baseline > 5 << 20, "{baseline}");

    for round in 0..3u64 {
        let a = write("a.bin", (9 << 20) + 7, 10 + round);
        let b = write("b.bin", 3 << 20, 20 + round);
        kt(&["put", "tmp/a", "--src", &a]);
        kt(&["put", "tmp/b", "--src", &b]);
        // A replaced version is garbage too.
        let b2 = write("b2.bin", 2 << 20, 30 + round);
        kt(&["put", "tmp/b", "--src", &b2, "-f"]);
        assert!(block_bytes(&blocks) > baseline + (9 << 20));
        kt(&["rm", "tmp", "-r"]);
    }
    assert!(
        eventually(Duration::from_secs(60), || block_bytes(&blocks) == baseline),
        "blocks take {} bytes, the live key needs {baseline}",
        block_bytes(&blocks)
    );
    let got = dir.path().join("got.bin");
    kt(&["get", "keep", "--dest", got.to_str().unwrap()]);
    assert!(std::fs::read(&got).unwrap() == std::fs::read(&keep).unwrap());
}

#[test]
fn a_full_disk_is_a_clear_error_and_the_store_recovers_when_space_returns() {
    let ip = "127.0.0.192";
    let dir = tempfile::tempdir().unwrap();
    let disk = Tmpfs::mount(&dir.path().join("disk"), 24);
    let server = spawn_ready(&[
        "server",
        "--listen",
        &format!("{ip}:0"),
        "--data-dir",
        disk.0.join("store").to_str().unwrap(),
        "--gc-interval-secs",
        "1",
    ]);
    let none = dir.path().join("no-agent.sock");
    let kt = |args: &[&str]| kt_with(&server.addr, &none, args);
    let write = |name: &str, len: usize, seed: u64| {
        let p = dir.path().join(name);
        std::fs::write(&p, pseudo_random(len, seed)).unwrap();
        p.to_str().unwrap().to_string()
    };
    let first = write("first.bin", 3 << 20, 1);
    assert!(kt(&["put", "first", "--src", &first]).status.success());
    // Something else on the disk, which an operator removes later.
    let ballast = disk.0.join("ballast");
    std::fs::write(&ballast, vec![0u8; 8 << 20]).unwrap();

    // More than the disk holds: one line that says so, and nothing published.
    let big = write("big.bin", 30 << 20, 2);
    let out = kt(&["put", "big", "--src", &big]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("No space left on device"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(kt(&["ls", "big"]).status.code(), Some(3));

    // Fill what is left, so that the database's own writes fail too.
    let filler = disk.fill("filler");
    // Many small files: their blocks go to the database, whose log cannot grow.
    let many = dir.path().join("many");
    std::fs::create_dir_all(&many).unwrap();
    for i in 0..300 {
        std::fs::write(many.join(format!("f{i}")), pseudo_random(3000, 100 + i)).unwrap();
    }
    let out = kt(&["put", "many", "--src", &format!("{}/", many.display())]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("No space left on device"), "{err}");

    // Space returns: the failed upload's blocks are collected, and puts work again without a
    // restart; what was published before is whole.
    std::fs::remove_file(&filler).unwrap();
    std::fs::remove_file(&ballast).unwrap();
    let after = write("after.bin", 2 << 20, 3);
    assert!(
        eventually(Duration::from_secs(60), || kt(&[
            "put", "after", "--src", &after
        ])
        .status
        .success()),
        "the store did not recover: {}",
        String::from_utf8_lossy(&kt(&["put", "after", "--src", &after]).stderr)
    );
    for (key, src) in [("first", &first), ("after", &after)] {
        let got = dir.path().join(format!("got-{key}"));
        assert!(kt(&["get", key, "--dest", got.to_str().unwrap()])
            .status
            .success());
        assert!(std::fs::read(&got).unwrap() == std::fs::read(src).unwrap());
    }
}

/// Temporary files the cache writes blocks under before renaming them.
fn half_written(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for fan in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(fan.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = f.file_name().to_string_lossy().into_owned();
            if name.contains(".tmp") {
                found.push(name);
            }
        }
    }
    found
}

#[test]
fn a_full_cache_disk_costs_the_node_its_copies_never_a_reader_its_read() {
    test_support::require_fuse();
    let ip = "127.0.0.196";
    let dir = tempfile::tempdir().unwrap();
    let server = start_server(ip, &dir.path().join("store"));
    let none = dir.path().join("no-agent.sock");
    let put = |key: &str, len: usize, seed: u64| -> Vec<u8> {
        let data = pseudo_random(len, seed);
        let p = dir.path().join(format!("{key}.bin"));
        std::fs::write(&p, &data).unwrap();
        let out = kt_with(
            &server.addr,
            &none,
            &["put", key, "--src", p.to_str().unwrap()],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        data
    };
    // The node's cache has the default budget (GiBs) on a disk of 40 MiB.
    let disk = Tmpfs::mount(&dir.path().join("disk"), 40);
    let node = start_mount(ip, &server.addr, &disk.0.join("n1"), "n1", &[]);
    let node_addr = node.proc.as_ref().unwrap().addr.clone();
    // Keys put by others show in a mount once its listing is older than LISTING_TTL.
    let read = |key: &str| -> Vec<u8> {
        let path = node.path(key);
        assert!(
            eventually(Duration::from_secs(10), || path.exists()),
            "{key}"
        );
        std::fs::read(path).unwrap()
    };
    let cache_bytes = || metric(&node_addr, "kt_cache_bytes") as u64;

    // More than the disk holds: the oldest blocks make room, and the read is whole.
    let big = put("big", 72 << 20, 1);
    assert!(read("big") == big);
    assert!(cache_bytes() < 40 << 20, "{}", cache_bytes());
    assert!(metric(&node_addr, "kt_cache_full_disk_total") > 0.0);

    // Something else fills the disk: reads still work, from the network.
    let ballast = disk.fill("ballast");
    let second = put("second", 24 << 20, 2);
    assert!(read("second") == second);
    assert!(read("big") == big);

    // Space returns: the node keeps copies again, with no restart (the first reads may find
    // its database still reopening), and nothing half written was left behind.
    std::fs::remove_file(&ballast).unwrap();
    let mut seed = 10;
    assert!(
        eventually(Duration::from_secs(60), || {
            seed += 1;
            let key = format!("after{seed}");
            let data = put(&key, 4 << 20, seed);
            read(&key) == data && node_serves(&node_addr, BlockHash::of(&data))
        }),
        "the node never cached a block again"
    );
    let blocks = disk.0.join("n1/cache/blocks");
    assert_eq!(half_written(&blocks), Vec::<String>::new());
    drop(node);
}

/// Whether the node at `addr` serves `block` on its data plane (the servers here ask for no
/// tickets).
fn node_serves(addr: &str, block: BlockHash) -> bool {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (mut tx, mut rx) = wire::connect(addr, wire::Peer::Store).await.unwrap();
        tx.get(&block).await.unwrap();
        matches!(rx.recv().await.unwrap(), wire::Response::Block(..))
    })
}

/// One series of a `/metrics` page at `addr`.
fn metric(addr: &str, series: &str) -> f64 {
    let text = http_get(addr, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {text}"))
}

#[test]
fn a_removed_file_held_open_reads_to_its_end_and_then_every_disk_gives_it_back() {
    test_support::require_fuse();
    let ip = "127.0.0.197";
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let server = gc_server(ip, &store);
    let none = dir.path().join("no-agent.sock");
    let kt = |args: &[&str]| ok_kt(&server, &none, args);
    let put = |key: &str, len: usize, seed: u64| -> Vec<u8> {
        let data = pseudo_random(len, seed);
        let p = dir.path().join(format!("{key}.bin"));
        std::fs::write(&p, &data).unwrap();
        kt(&["put", key, "--src", p.to_str().unwrap()]);
        data
    };
    let blocks = store.join("blocks");
    let keep = put("keep", (5 << 20) + 3, 1);
    let keep_bytes = block_bytes(&blocks);
    let doomed = put("doomed", 24 << 20, 2);
    let node = start_mount(ip, &server.addr, &dir.path().join("n1"), "n1", &[]);
    let node_addr = node.proc.as_ref().unwrap().addr.clone();
    let cache_bytes = || metric(&node_addr, "kt_cache_bytes") as u64;
    assert!(std::fs::read(node.path("keep")).unwrap() == keep);

    // Opened, not read yet; then removed, and collection runs while it stays open.
    let mut open = std::fs::File::open(node.path("doomed")).unwrap();
    assert!(
        eventually(Duration::from_secs(20), || metric(
            &server.addr,
            "kt_open_versions"
        ) == 1.0),
        "the node never said it has a version open"
    );
    let junk = put("junk", 3 << 20, 3);
    kt(&["rm", "doomed"]);
    kt(&["rm", "junk"]);
    drop(junk);
    let with_doomed = keep_bytes + (24 << 20);
    assert!(
        eventually(Duration::from_secs(60), || block_bytes(&blocks)
            == with_doomed),
        "blocks take {} bytes; the kept key and the open file need {with_doomed}",
        block_bytes(&blocks)
    );
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut open, &mut got).unwrap();
    assert!(got == doomed, "the open file did not read whole");
    let cached = cache_bytes();
    assert!(cached >= keep.len() as u64 + (24 << 20), "{cached}");

    // Closed: the store collects the version, and the node drops its copies from its cache.
    drop(open);
    assert!(
        eventually(Duration::from_secs(60), || block_bytes(&blocks)
            == keep_bytes),
        "the closed file's blocks stay: {} bytes, the live key needs {keep_bytes}",
        block_bytes(&blocks)
    );
    assert!(
        eventually(Duration::from_secs(30), || cache_bytes()
            == keep.len() as u64),
        "the node's cache holds {} bytes, the live key {}",
        cache_bytes(),
        keep.len()
    );
    assert_eq!(metric(&server.addr, "kt_open_versions"), 0.0);
    assert!(std::fs::read(node.path("keep")).unwrap() == keep);

    // A key published in place on the node, then removed: once collected, the node stops
    // serving its block from the writer's file (which stays where it is).
    let local = dir.path().join("local.bin");
    std::fs::write(&local, pseudo_random(300_000, 4)).unwrap();
    let block = BlockHash::of(&std::fs::read(&local).unwrap());
    let out = kt_with(
        &server.addr,
        &node.socket,
        &[
            "put",
            "mine",
            "--src",
            local.to_str().unwrap(),
            "--locale",
            "local",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let served = || node_serves(&node_addr, block);
    assert!(served());
    kt(&["rm", "mine"]);
    assert!(
        eventually(Duration::from_secs(30), || !served()),
        "the node still serves a removed key's block"
    );
    assert!(local.exists());
}
