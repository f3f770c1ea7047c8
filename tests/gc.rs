//! Garbage collection on a real store server: after cycles of put, replace and rm, the disk
//! its blocks take returns to what the live keys need, and the live keys still read whole.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

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

#[test]
fn disk_use_returns_to_what_live_keys_need_after_puts_and_removals() {
    let ip = "127.0.0.190";
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let server = spawn_ready(&[
        "server",
        "--listen",
        &format!("{ip}:0"),
        "--data-dir",
        store.to_str().unwrap(),
        "--gc-interval-secs",
        "1",
    ]);
    let none = dir.path().join("no-agent.sock");
    let kt = |args: &[&str]| {
        let out = kt_with(&server.addr, &none, args);
        assert!(
            out.status.success(),
            "kt {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
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
