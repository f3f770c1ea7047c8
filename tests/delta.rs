//! Insertions and deltas against a real store server: a one-line insertion in the middle of a
//! large file sends a small delta on the next put, and the key reads back byte-identical; the
//! store refuses a delta that rebuilds other bytes and stores nothing; and a delta ktfs makes
//! applies with librsync's `rdiff patch`.

mod common;

use std::process::Command;

use common::{http_get, pseudo_random, Cluster};
use ktfs::dataplane::delta;
use ktfs::dataplane::wire::{self, Response};
use ktfs::hash::BlockHash;
use ktfs::manifest::DEFAULT_BLOCK_SIZE;

fn with_line_inserted(data: &[u8]) -> Vec<u8> {
    let mid = data.len() / 2;
    let mut v = data[..mid].to_vec();
    v.extend_from_slice(b"a line inserted in the middle of the file\n");
    v.extend_from_slice(&data[mid..]);
    v
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {text}"))
}

#[test]
fn an_insertion_in_the_middle_puts_a_small_delta_and_reads_back_identical() {
    let c = Cluster::new("127.0.0.50");
    let src = c.path("big.bin");
    let data = pseudo_random(20 << 20, 18);
    std::fs::write(&src, &data).unwrap();
    let src_s = src.to_str().unwrap();
    let first = c.json(None, &["put", "big", "--src", src_s]);
    assert_eq!(first["bytes_transferred"], data.len() as u64);

    let edited = with_line_inserted(&data);
    std::fs::write(&src, &edited).unwrap();
    let second = c.json(None, &["put", "big", "--src", src_s, "-f"]);
    let sent = second["bytes_transferred"].as_u64().unwrap();
    assert!(
        sent > 0 && sent < u64::from(DEFAULT_BLOCK_SIZE) / 16,
        "the second put sent {sent} bytes"
    );
    let metrics = http_get(&c.server.addr, "/metrics");
    assert!(
        metric(&metrics, "kt_delta_blocks_total") >= 1.0,
        "{metrics}"
    );
    assert!(metric(&metrics, "kt_delta_bytes_total") < sent as f64);

    let out = c.path("out.bin");
    c.ok(None, &["get", "big", "--dest", out.to_str().unwrap()]);
    assert!(std::fs::read(&out).unwrap() == edited, "read back differs");
}

#[test]
fn the_store_refuses_a_delta_that_rebuilds_other_bytes_and_stores_nothing() {
    let c = Cluster::new("127.0.0.51");
    let old = pseudo_random(2 << 20, 1);
    let new = with_line_inserted(&old);
    let (old_h, new_h) = (BlockHash::of(&old), BlockHash::of(&new));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (mut tx, mut rx) = wire::connect(&c.server.addr, wire::Peer::Store)
            .await
            .unwrap();
        tx.put(&old_h, &old).await.unwrap();
        assert!(matches!(rx.recv().await.unwrap(), Response::Stored(h) if h == old_h));

        // The store's signature of what it holds makes a small delta that rebuilds `new`.
        tx.signature(&old_h).await.unwrap();
        let sig = match rx.recv().await.unwrap() {
            Response::Signature(h, sig) if h == old_h => sig,
            other => panic!("{other:?}"),
        };
        let d = delta::diff(&sig, &new).unwrap();
        assert!(d.len() < new.len() / 50, "delta of {} bytes", d.len());

        // Claimed for another hash, a garbled delta, a missing base: refused, nothing stored.
        let lie = BlockHash::of(b"something else");
        tx.put_delta(&lie, &old_h, &d).await.unwrap();
        match rx.recv().await.unwrap() {
            Response::Error(m) => assert!(m.contains("rebuilds other bytes"), "{m}"),
            other => panic!("{other:?}"),
        }
        tx.put_delta(&new_h, &old_h, b"garbage").await.unwrap();
        match rx.recv().await.unwrap() {
            Response::Error(m) => assert!(m.contains("does not apply"), "{m}"),
            other => panic!("{other:?}"),
        }
        let gone = BlockHash::of(b"never stored");
        tx.put_delta(&new_h, &gone, &d).await.unwrap();
        assert!(matches!(rx.recv().await.unwrap(), Response::NotFound(h) if h == gone));
        for h in [lie, new_h] {
            tx.get(&h).await.unwrap();
            assert!(matches!(rx.recv().await.unwrap(), Response::NotFound(_)));
        }

        // The honest delta is stored, and the block reads back whole.
        tx.put_delta(&new_h, &old_h, &d).await.unwrap();
        assert!(matches!(rx.recv().await.unwrap(), Response::Stored(h) if h == new_h));
        tx.get(&new_h).await.unwrap();
        match rx.recv().await.unwrap() {
            Response::Block(h, b) => assert!(h == new_h && b[..] == new[..]),
            other => panic!("{other:?}"),
        }

        // A getter's delta request: garbage for a signature is refused; the signature of the
        // getter's older bytes gets a small delta that rebuilds the block from them.
        tx.get_delta(&new_h, b"garbage").await.unwrap();
        match rx.recv().await.unwrap() {
            Response::Error(m) => assert!(m.contains("signature"), "{m}"),
            other => panic!("{other:?}"),
        }
        tx.get_delta(&new_h, &delta::signature(&old)).await.unwrap();
        match rx.recv().await.unwrap() {
            Response::Delta(h, d) => {
                assert!(h == new_h && d.len() < new.len() / 50, "{} bytes", d.len());
                assert!(delta::apply(&old, &d, new.len()).unwrap() == new);
            }
            other => panic!("{other:?}"),
        }
    });
}

fn rdiff() -> Command {
    let found = Command::new("rdiff").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "rdiff (librsync's tool, Debian package `rdiff`) is not installed: scripts/test.sh installs it"
    );
    Command::new("rdiff")
}

#[test]
fn deltas_interoperate_with_librsync_rdiff() {
    let dir = tempfile::tempdir().unwrap();
    let old = pseudo_random(3 << 20, 9);
    let new = with_line_inserted(&old);
    let p = |n: &str| dir.path().join(n);
    std::fs::write(p("old"), &old).unwrap();
    std::fs::write(p("new"), &new).unwrap();

    // A delta made by ktfs, applied by librsync.
    let d = delta::diff(&delta::signature(&old), &new).unwrap();
    std::fs::write(p("ktfs.delta"), &d).unwrap();
    let st = rdiff()
        .arg("patch")
        .args([p("old"), p("ktfs.delta"), p("patched")])
        .status()
        .unwrap();
    assert!(st.success(), "rdiff patch failed");
    assert!(std::fs::read(p("patched")).unwrap() == new);

    // A signature made by librsync (MD4 and rsync's rolling sum, as ktfs makes them), diffed
    // by ktfs and applied by both.
    let st = rdiff()
        .args([
            "signature",
            "--hash=md4",
            "--rollsum=rollsum",
            "-b",
            "2048",
            "-S",
            "8",
        ])
        .args([p("old"), p("rdiff.sig")])
        .status()
        .unwrap();
    assert!(st.success(), "rdiff signature failed");
    let sig = std::fs::read(p("rdiff.sig")).unwrap();
    let d = delta::diff(&sig, &new).unwrap();
    assert!(d.len() < 16 << 10, "delta of {} bytes", d.len());
    assert_eq!(delta::apply(&old, &d, new.len()).unwrap(), new);
    std::fs::write(p("rdiff-sig.delta"), &d).unwrap();
    let st = rdiff()
        .arg("patch")
        .args([p("old"), p("rdiff-sig.delta"), p("patched2")])
        .status()
        .unwrap();
    assert!(st.success(), "rdiff patch failed");
    assert!(std::fs::read(p("patched2")).unwrap() == new);
}

/// A `kt get -f` onto an older, locally modified copy: the blocks the copy still holds come
/// from it, the changed one comes as a delta against the copy's bytes, and the file lands as
/// the version. Through a node's agent, which serves the getter's earlier copy in place (the
/// very file being replaced): the getter asks the store, not its own node, for deltas.
#[test]
fn a_get_onto_a_modified_copy_takes_what_it_holds_and_fetches_a_delta() {
    let c = Cluster::new("127.0.0.25");
    let agent = c.agent("127.0.0.26", "getter");
    let src = c.path("big.bin");
    let data = pseudo_random(20 << 20, 21);
    std::fs::write(&src, &data).unwrap();
    c.ok(None, &["put", "big", "--src", src.to_str().unwrap()]);
    let out = c.path("out.bin");
    let out_s = out.to_str().unwrap();
    let first = c.json(Some(&agent), &["get", "big", "--dest", out_s]);
    assert_eq!(first["bytes_transferred"], data.len() as u64);

    // Edited here: a line inserted in the middle.
    std::fs::write(&out, with_line_inserted(&data)).unwrap();
    let refused = c.kt(Some(&agent), &["get", "big", "--dest", out_s]);
    assert!(
        !refused.status.success(),
        "overwrote a differing file without -f"
    );
    let second = c.json(Some(&agent), &["get", "big", "--dest", out_s, "-f"]);
    assert!(
        std::fs::read(&out).unwrap() == data,
        "the get landed other bytes"
    );
    let sent = second["bytes_transferred"].as_u64().unwrap();
    assert!(
        sent < u64::from(DEFAULT_BLOCK_SIZE) / 16,
        "{sent} bytes crossed the network for a one-line edit: {second}"
    );
    assert!(second["delta_blocks"].as_u64().unwrap() >= 1, "{second}");
    assert!(
        second["bytes_reused"].as_u64().unwrap() >= data.len() as u64 / 2,
        "{second}"
    );

    // A copy with nothing in common is fetched whole (the store answers each delta request
    // with the block), and still lands as the version.
    std::fs::write(&out, pseudo_random(12 << 20, 77)).unwrap();
    let third = c.json(Some(&agent), &["get", "big", "--dest", out_s, "-f"]);
    assert!(
        std::fs::read(&out).unwrap() == data,
        "the get landed other bytes"
    );
    assert_eq!(third["bytes_reused"], 0);
    assert_eq!(third["delta_blocks"], 0);
    assert!(third["bytes_transferred"].as_u64().unwrap() >= data.len() as u64);
}

/// A put whose index names a version the store never held (the store was replaced by an empty
/// one at the same address) offers a patch, is refused, and publishes the whole manifest: the
/// blocks it uploaded for the refused patch count, so the report says what crossed the network.
#[test]
fn a_put_against_a_store_that_forgot_its_base_counts_what_it_sent() {
    let dir = tempfile::tempdir().unwrap();
    let index = dir.path().join("index");
    let put = |server: &str, src: &std::path::Path| -> serde_json::Value {
        let out = Command::new(common::kt_bin())
            .args(["put", "big", "--json", "--src", src.to_str().unwrap()])
            .env("KT_SERVER", server)
            .env("KT_AGENT", dir.path().join("no-agent.sock"))
            .env("KT_INDEX_DIR", &index)
            .env_remove("KT_NAMESPACE")
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let first = common::start_server("127.0.0.78", &dir.path().join("a"));
    let addr = first.addr.clone();
    let src = dir.path().join("big.bin");
    let data = pseudo_random(3 << 20, 23);
    std::fs::write(&src, &data).unwrap();
    assert_eq!(put(&addr, &src)["bytes_transferred"], data.len() as u64);
    assert!(first.stop().success());

    let second = common::spawn_ready(&[
        "server",
        "--listen",
        &addr,
        "--data-dir",
        dir.path().join("b").to_str().unwrap(),
    ]);
    assert_eq!(second.addr, addr);
    let edited = with_line_inserted(&data);
    std::fs::write(&src, &edited).unwrap();
    let again = put(&addr, &src);
    assert_eq!(again["sent_as"], "manifest", "{again}");
    assert!(
        again["bytes_transferred"].as_u64().unwrap() >= edited.len() as u64,
        "{again}"
    );
    let out = dir.path().join("out.bin");
    let got = common::kt_with(
        &addr,
        &dir.path().join("no-agent.sock"),
        &["get", "big", "--dest", out.to_str().unwrap()],
    );
    assert!(got.status.success());
    assert!(std::fs::read(&out).unwrap() == edited, "read back differs");
}
