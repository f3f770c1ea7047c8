//! `kt mount --writeback`: a close returns once the file is journaled on its node, and the
//! publish follows; the writer's node sees its files at once, other nodes once the publish
//! lands; namespace changes that involve queued files publish them first; `fsync` waits; and
//! what was queued survives a `kill -9` of the agent. Real processes: a store server, a
//! write-back mount A and a plain mount B. The store server is stopped (SIGSTOP) to hold
//! publishes back: a close that returns while it is stopped did not wait for its publish.
//! These tests need /dev/fuse and root; they never skip themselves.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::*;

/// A store server, a write-back mount A on `ip_a` and a plain mount B on `ip_b`, both
/// watching.
fn nodes(ip_a: &str, ip_b: &str) -> (Cluster, MountProc, MountProc) {
    two_watching_mounts(ip_a, ip_b, &["--writeback"])
}

/// Holds the store server stopped until [`Stopped::resume`] (or drop, a failed assertion
/// included). A step that wrongly waits for the server would hang the test: a watchdog
/// continues the server after 20 s, and `resume` says whether it had to.
struct Stopped {
    pid: i32,
    done: Option<std::sync::mpsc::Sender<()>>,
    watchdog: Option<std::thread::JoinHandle<bool>>,
}

impl Stopped {
    fn new(c: &Cluster) -> Self {
        let pid = c.server.pid() as i32;
        signal(pid, libc::SIGSTOP);
        let (done, rx) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            let fired = rx.recv_timeout(Duration::from_secs(20))
                == Err(std::sync::mpsc::RecvTimeoutError::Timeout);
            signal(pid, libc::SIGCONT);
            fired
        });
        Stopped {
            pid,
            done: Some(done),
            watchdog: Some(watchdog),
        }
    }

    /// Continues the server; whether the watchdog had to.
    fn resume(mut self) -> bool {
        self.finish()
    }

    fn finish(&mut self) -> bool {
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
        let fired = self.watchdog.take().is_some_and(|w| w.join().unwrap());
        signal(self.pid, libc::SIGCONT);
        fired
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.finish();
    }
}

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// The staged files of the mount whose agent's directory is `dir`: a queued file's bytes
/// stay staged until its publish lands.
fn staged(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir.join("cache/staging"))
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn closes_return_before_their_publish_and_namespace_changes_carry_queued_files() {
    let (c, a, b) = nodes("127.0.0.216", "127.0.0.217");
    std::fs::create_dir(a.path("t")).unwrap();
    // What A knows of t (under its lease) is cached before the server stops.
    assert!(std::fs::metadata(a.path("t/f0")).is_err());
    {
        let stopped = Stopped::new(&c);
        for i in 0..5 {
            std::fs::write(a.path(&format!("t/f{i}")), format!("v{i}")).unwrap();
        }
        // A change to a closed, queued file is queued with it.
        std::fs::set_permissions(a.path("t/f0"), std::fs::Permissions::from_mode(0o600)).unwrap();
        // The writer's node sees its files at once.
        assert_eq!(std::fs::read_to_string(a.path("t/f3")).unwrap(), "v3");
        assert_eq!(mode(&a.path("t/f0")), 0o600);
        // A rename of their directory waits for the server (in a thread, continued below).
        let from = a.path("t");
        let to = a.path("u");
        let mover = std::thread::spawn(move || std::fs::rename(from, to));
        assert!(
            !stopped.resume(),
            "a close or a look at a queued file waited for the server"
        );
        mover.join().unwrap().unwrap();
    }
    // The move carried every queued file, with its bytes and mode: B sees them at once (the
    // rename returned after the server told B).
    for i in 0..5 {
        assert_eq!(
            std::fs::read_to_string(b.path(&format!("u/f{i}"))).unwrap(),
            format!("v{i}")
        );
    }
    assert_eq!(mode(&b.path("u/f0")), 0o600);
    assert!(std::fs::metadata(b.path("t")).is_err());
    assert_eq!(std::fs::read_to_string(a.path("u/f1")).unwrap(), "v1");
    assert_eq!(std::fs::read_dir(a.path("u")).unwrap().count(), 5);

    // An unlinked queued file never shows on another node.
    {
        let stopped = Stopped::new(&c);
        std::fs::write(a.path("u/gone"), b"soon gone").unwrap();
        let p = a.path("u/gone");
        let remover = std::thread::spawn(move || std::fs::remove_file(p));
        assert!(!stopped.resume(), "a close waited for the server");
        remover.join().unwrap().unwrap();
    }
    // fsync of a directory waits for every queued publish below it.
    std::fs::write(a.path("u/late"), b"late").unwrap();
    std::fs::File::open(a.path("u"))
        .unwrap()
        .sync_all()
        .unwrap();
    assert_eq!(std::fs::read(b.path("u/late")).unwrap(), b"late");
    assert!(std::fs::metadata(b.path("u/gone")).is_err());
    assert!(std::fs::metadata(a.path("u/gone")).is_err());
    // fsync of a file publishes it before it returns.
    {
        use std::io::Write;
        let mut f = std::fs::File::create(a.path("u/synced")).unwrap();
        f.write_all(b"synced").unwrap();
        f.sync_all().unwrap();
        assert_eq!(std::fs::read(b.path("u/synced")).unwrap(), b"synced");
    }
    // Queued publishes land without being asked for (within a second or so, as the server
    // keeps up); nothing is left in the journal.
    std::fs::write(a.path("u/unasked"), b"on its own").unwrap();
    assert!(eventually(Duration::from_secs(10), || {
        std::fs::read(b.path("u/unasked")).is_ok_and(|d| d == b"on its own")
    }));
    std::fs::File::open(&a.mountpoint)
        .unwrap()
        .sync_all()
        .unwrap();
    assert!(staged(&a.dir).is_empty(), "{:?}", staged(&a.dir));
    assert_eq!(
        metric(&a.proc.as_ref().unwrap().addr, "kt_writeback_failed_total"),
        0.0
    );
    assert!(
        metric(
            &a.proc.as_ref().unwrap().addr,
            "kt_writeback_published_total"
        ) >= 8.0
    );
}

#[test]
fn queued_publishes_survive_a_kill_9_of_the_agent() {
    let (c, mut a, b) = nodes("127.0.0.218", "127.0.0.220");
    std::fs::create_dir(a.path("d")).unwrap();
    assert!(std::fs::metadata(a.path("d/f0")).is_err());
    // Small files are staged in memory and journaled with their bytes; a large one is
    // staged in a file, which the journal names.
    let big = |i: usize| -> Vec<u8> {
        (0..200_000u32)
            .map(|n| (n as usize * 7 + i) as u8)
            .collect()
    };
    {
        let stopped = Stopped::new(&c);
        for i in 0..20 {
            std::fs::write(a.path(&format!("d/f{i}")), format!("queued {i}")).unwrap();
        }
        for i in 0..2 {
            std::fs::write(a.path(&format!("d/big{i}")), big(i)).unwrap();
        }
        assert_eq!(staged(&a.dir).len(), 2, "{:?}", staged(&a.dir));
        // Killed with all 22 queued. (The publishes it had sent, at most one per flusher, may
        // still land: the stopped server reads them when it continues. The rest cannot.)
        a.crash();
        assert!(!stopped.resume(), "a close waited for the server");
    }
    // The next agent on the mount (without --writeback: what was journaled is published
    // whatever the new mount's options) publishes them.
    let a2 = start_mount("127.0.0.218", &c.server.addr, &a.dir, &a.node_id, &[]);
    let missing = || -> Vec<String> {
        let small = (0..20)
            .filter(|i| {
                std::fs::read_to_string(b.path(&format!("d/f{i}")))
                    .map_or(true, |s| s != format!("queued {i}"))
            })
            .map(|i| format!("f{i}"));
        let large = (0..2)
            .filter(|i| std::fs::read(b.path(&format!("d/big{i}"))).map_or(true, |d| d != big(*i)))
            .map(|i| format!("big{i}"));
        small.chain(large).collect()
    };
    let a2_addr = a2.proc.as_ref().unwrap().addr.clone();
    assert!(
        eventually(Duration::from_secs(20), || missing().is_empty()),
        "B lacks {:?}; A2 published {}, retried {}, failed {}; staged {:?}",
        missing(),
        metric(&a2_addr, "kt_writeback_published_total"),
        metric(&a2_addr, "kt_writeback_retries_total"),
        metric(&a2_addr, "kt_writeback_failed_total"),
        staged(&a2.dir),
    );
    std::fs::File::open(&a2.mountpoint)
        .unwrap()
        .sync_all()
        .unwrap();
    assert!(staged(&a2.dir).is_empty(), "{:?}", staged(&a2.dir));
    assert_eq!(
        std::fs::read_to_string(a2.path("d/f7")).unwrap(),
        "queued 7"
    );
}
