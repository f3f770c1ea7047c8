//! Acknowledged publishes survive a crash of the store server: concurrent `kt put` clients
//! publish small files, the server is killed with SIGKILL while they still do, and the server
//! started again on the same data directory has every key a client was told was published,
//! at the version it was told.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::*;

/// Clients putting at once.
const CLIENTS: usize = 6;
/// Publishes acknowledged before the kill.
const ACKED_BEFORE_KILL: usize = 30;

/// A publish a client was told succeeded: its key, version and bytes.
struct Acked {
    key: String,
    version: String,
    data: Vec<u8>,
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).expect("json output")
}

#[test]
fn every_acknowledged_publish_survives_a_kill_of_the_server() {
    let ip = "127.0.0.55";
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let server = start_server(ip, &store);
    let addr = server.addr.clone();
    let none = dir.path().join("no-agent.sock");
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let count = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (acked, count, stop) = (acked.clone(), count.clone(), stop.clone());
            let (addr, none, root) = (addr.clone(), none.clone(), dir.path().to_path_buf());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let key = format!("d/c{c}-f{i}");
                    let data = pseudo_random(4096, (c as u64) << 32 | i);
                    let src = root.join(format!("c{c}-f{i}"));
                    std::fs::write(&src, &data).unwrap();
                    let out = kt_with(
                        &addr,
                        &none,
                        &["put", &key, "--src", src.to_str().unwrap(), "--json"],
                    );
                    // Refused or cut off by the kill: never acknowledged, nothing promised.
                    if out.status.success() {
                        let version = json(&out)["version"].as_str().unwrap().to_string();
                        acked.lock().unwrap().push(Acked { key, version, data });
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    assert!(
        eventually(std::time::Duration::from_secs(120), || count
            .load(Ordering::SeqCst)
            >= ACKED_BEFORE_KILL),
        "only {} publishes in two minutes",
        count.load(Ordering::SeqCst)
    );
    // Syncs first: both only grow, and the clients still publish between the two reads. A
    // change is counted once its waiter takes its outcome, after its batch's sync: each
    // client has at most one change synced and not yet counted.
    let syncs = metric(&addr, "kt_meta_wal_syncs");
    let commits = metric(&addr, "kt_meta_commits");
    assert!(commits >= ACKED_BEFORE_KILL as f64, "{commits} commits");
    assert!(
        syncs >= 1.0 && syncs <= commits + CLIENTS as f64,
        "{syncs} syncs for {commits} commits"
    );
    // Killed while the clients still publish.
    server.kill();
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }

    let server = start_server(ip, &store);
    let acked = acked.lock().unwrap();
    assert!(acked.len() >= ACKED_BEFORE_KILL);
    for (i, Acked { key, version, data }) in acked.iter().enumerate() {
        let dest = dir.path().join(format!("got-{i}"));
        let out = kt_with(
            &server.addr,
            &none,
            &["get", key, "--dest", dest.to_str().unwrap(), "--json"],
        );
        assert!(
            out.status.success(),
            "acknowledged {key} lost in the crash: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            json(&out)["versions"][0].as_str(),
            Some(version.as_str()),
            "{key}"
        );
        assert!(std::fs::read(&dest).unwrap() == *data, "{key}: other bytes");
    }
}
