//! Cluster mode's metadata on a real etcd (Debian's, one member on loopback): a store server
//! started with `--meta etcd://...` keeps keys, manifests and attributes there, so a server on
//! another data directory lists them (blocks stay on the data directory's disk until step 2 of
//! doc/cluster.md moves them to an object store), another prefix of the same etcd sees none, and an etcd
//! that is gone makes writes fail with an error rather than hang. (The test command also runs
//! the metadata-heavy tests a second time on etcd; this file needs no such pass.)

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{kt_with, pseudo_random, spawn_ready};
use test_support::etcd::Etcd;
use test_support::Proc;

fn server_on(ip: &str, data_dir: &Path, meta: &str) -> Proc {
    spawn_ready(&[
        "server",
        "--listen",
        &format!("{ip}:0"),
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--meta",
        meta,
    ])
}

/// Starts a store server on `meta` that must exit with an error (within 20 s, else it is killed
/// and the test fails); returns what it printed on stderr.
fn refused_server(ip: &str, data_dir: &Path, meta: &str) -> String {
    let mut child = std::process::Command::new(common::kt_bin())
        .args(["server", "--listen", &format!("{ip}:0"), "--data-dir"])
        .arg(data_dir)
        .args(["--meta", meta])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let exited = test_support::eventually(Duration::from_secs(20), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if !exited {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        exited && !out.status.success(),
        "{meta}: the server started"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_store_on_etcd_keeps_its_keys_there_for_any_server_of_the_same_prefix() {
    let ip = "127.0.0.109";
    let etcd = Etcd::start(ip);
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-agent.sock");
    let ok = |server: &Proc, args: &[&str]| {
        let out = kt_with(&server.addr, &none, args);
        assert!(
            out.status.success(),
            "kt {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("small.txt"), b"hello etcd\n").unwrap();
    let big = pseudo_random(3 << 20, 31);
    std::fs::write(src.join("sub/big.bin"), &big).unwrap();

    let first = server_on(ip, &dir.path().join("one"), &etcd.url("kt-a"));
    ok(
        &first,
        &["put", "proj/tree", "--src", &format!("{}/", src.display())],
    );
    ok(
        &first,
        &[
            "put",
            "proj/note",
            "--src",
            src.join("small.txt").to_str().unwrap(),
        ],
    );
    ok(&first, &["rm", "proj/note"]);
    let out = dir.path().join("out");
    ok(
        &first,
        &["get", "proj/tree", "--dest", out.to_str().unwrap()],
    );
    assert!(std::fs::read(out.join("tree/sub/big.bin")).unwrap() == big);
    assert!(first.stop().success());

    // Another server, with a data directory of its own: the keys are etcd's, not its disk's.
    let second = server_on(ip, &dir.path().join("two"), &etcd.url("kt-a"));
    let listed = ok(&second, &["ls", "proj", "--json"]);
    assert!(listed.contains("tree"), "{listed}");
    assert!(!listed.contains("note"), "{listed}");
    // Its blocks are still the first server's disk's (until they move to an object store).
    assert!(second.stop().success());
    let second = server_on(ip, &dir.path().join("one"), &etcd.url("kt-a"));
    let again = dir.path().join("again");
    ok(
        &second,
        &["get", "proj/tree", "--dest", again.to_str().unwrap()],
    );
    assert_eq!(
        std::fs::read(again.join("tree/small.txt")).unwrap(),
        b"hello etcd\n"
    );
    ok(&second, &["rm", "proj/tree", "--recursive"]);
    let listed = ok(&second, &["ls", "", "--json"]);
    assert!(!listed.contains("proj"), "{listed}");

    // Another prefix of the same etcd is another store.
    let other = server_on("127.0.0.115", &dir.path().join("three"), &etcd.url("kt-b"));
    ok(
        &other,
        &[
            "put",
            "only/here",
            "--src",
            src.join("small.txt").to_str().unwrap(),
        ],
    );
    let listed = ok(&second, &["ls", "", "--json"]);
    assert!(!listed.contains("only"), "{listed}");

    // etcd gone: a write fails, and says why, within the engine's request timeout.
    drop(etcd);
    let start = Instant::now();
    let failed = kt_with(
        &second.addr,
        &none,
        &[
            "put",
            "after/etcd",
            "--src",
            src.join("small.txt").to_str().unwrap(),
        ],
    );
    assert!(!failed.status.success());
    assert!(start.elapsed() < Duration::from_secs(30));
    let err = String::from_utf8_lossy(&failed.stderr);
    assert!(err.contains("metadata"), "{err}");

    // A server whose etcd cannot be reached says so and exits, rather than listening.
    let err = refused_server(
        ip,
        &dir.path().join("four"),
        &format!("etcd://{ip}:2379/kt-a"),
    );
    assert!(err.contains("metadata engine cannot be reached"), "{err}");
}

/// etcd's TLS passes through: a store server gives the CA, and its own certificate to a cluster
/// that asks clients for one; without them it is refused at its start.
#[test]
fn a_store_reaches_an_etcd_over_tls_with_the_files_its_address_names() {
    let ip = "127.0.0.120";
    let dir = tempfile::tempdir().unwrap();
    let pki = test_support::tls::Pki::new(&[ip]);
    let (ca, cert, key) = pki.write(dir.path());
    let etcd = Etcd::start_tls(ip, &ca, &cert, &key);
    let url = format!(
        "etcd://{ip}:2379/kt-tls?ca={}&cert={}&key={}",
        ca.display(),
        cert.display(),
        key.display()
    );
    let server = server_on(ip, &dir.path().join("one"), &url);
    let none = dir.path().join("no-agent.sock");
    let src = dir.path().join("note.txt");
    std::fs::write(&src, b"over tls\n").unwrap();
    let put = kt_with(
        &server.addr,
        &none,
        &["put", "tls/note", "--src", src.to_str().unwrap()],
    );
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    let ls = kt_with(&server.addr, &none, &["ls", "tls", "--json"]);
    assert!(String::from_utf8_lossy(&ls.stdout).contains("note"));
    drop(server);

    // Without a client certificate (the cluster asks for one), or without the CA: no server.
    for meta in [
        format!("etcd://{ip}:2379/kt-tls?ca={}", ca.display()),
        format!("etcd://{}/kt-tls", etcd.endpoint),
    ] {
        let err = refused_server(ip, &dir.path().join("two"), &meta);
        assert!(err.contains("metadata engine"), "{meta}: {err}");
    }
}
