//! Cluster mode on a real etcd (Debian's, one member on loopback) and a real S3 server
//! (s3s-fs): a store server started with `--meta etcd://...` keeps keys, manifests and
//! attributes there, so a server on another data directory lists them, another prefix of the
//! same etcd sees none, and an etcd that is gone makes writes fail with an error rather than
//! hang; with `--blocks s3://...` too, its blocks and manifests are objects, and a server on an
//! empty data directory serves everything another published. (The test command also runs
//! the metadata-heavy tests a second time on etcd; this file needs no such pass.)

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{kt_with, pseudo_random, spawn_ready};
use test_support::etcd::Etcd;
use test_support::s3::S3;
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

/// `kt ARGS` against `server`, which must succeed; its stdout.
fn ok_with(server: &Proc, agent: &Path, args: &[&str]) -> String {
    let out = kt_with(&server.addr, agent, args);
    assert!(
        out.status.success(),
        "kt {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Starts a store server with `args` (and `env`) that must exit with an error (within 20 s,
/// else it is killed and the test fails); returns what it printed on stderr.
fn refused_server(ip: &str, data_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut child = std::process::Command::new(common::kt_bin())
        .args(["server", "--listen", &format!("{ip}:0"), "--data-dir"])
        .arg(data_dir)
        .args(args)
        .envs(env.iter().copied())
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
        "{args:?}: the server started"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A store server of the store on `etcd` at `prefix` whose blocks are `blocks` (an `s3://`
/// URL of `s3`), listening on `ip`, its data directory `data`, with `extra` flags.
fn replica_on(
    ip: &str,
    (etcd, prefix): (&Etcd, &str),
    (s3, blocks): (&S3, &str),
    data: &Path,
    extra: &[&str],
) -> Proc {
    let mut cmd = std::process::Command::new(common::kt_bin());
    cmd.args(["server", "--listen", &format!("{ip}:0"), "--data-dir"])
        .arg(data)
        .args(["--meta", &etcd.url(prefix), "--blocks", blocks])
        .args(extra)
        .envs(s3.env())
        .env(
            "RUST_LOG",
            std::env::var("KT_TEST_SERVER_LOG").unwrap_or("warn".into()),
        );
    test_support::spawn_ready(cmd)
}

#[test]
fn a_store_on_etcd_keeps_its_keys_there_for_any_server_of_the_same_prefix() {
    let ip = "127.0.0.109";
    let etcd = Etcd::start(ip);
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-agent.sock");
    let ok = |server: &Proc, args: &[&str]| ok_with(server, &none, args);
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
        &["--meta", &format!("etcd://{ip}:2379/kt-a")],
        &[],
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
        let err = refused_server(ip, &dir.path().join("two"), &["--meta", &meta], &[]);
        assert!(err.contains("metadata engine"), "{meta}: {err}");
    }
}

/// A store server on etcd (keys) and a real S3 server (blocks and manifests: s3s-fs) keeps
/// nothing on its disk that another needs: a second server on an empty data directory serves
/// what the first published, byte for byte; a manifest over etcd's request limit publishes (it
/// is an object, not a value in etcd's transaction), a small one stays in etcd, and so do small
/// blocks, unless the metadata is given no room for them; and a server whose object store
/// refuses it says so at its start.
#[test]
fn servers_on_etcd_and_s3_serve_each_others_keys_with_nothing_on_their_disks() {
    let ip = "127.0.0.126";
    let etcd = Etcd::start(ip);
    let s3 = S3::start(ip, "kt-bucket");
    let blocks = s3.url("kt-bucket", "cluster/one");
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-agent.sock");
    let server = |data: &str| {
        let at = dir.path().join(data);
        replica_on(ip, (&etcd, "kt-s3"), (&s3, &blocks), &at, &[])
    };
    let ok = |server: &Proc, args: &[&str]| ok_with(server, &none, args);
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("many")).unwrap();
    let big = pseudo_random(6 << 20, 41);
    std::fs::write(src.join("big.bin"), &big).unwrap();
    std::fs::write(src.join("small.txt"), b"hello s3\n").unwrap();
    // Enough files of long names that their manifest outgrows one etcd request; empty, as
    // their names alone make the size.
    let files = 8_000;
    let long = "n".repeat(200);
    for i in 0..files {
        std::fs::write(src.join(format!("many/{long}-{i:05}")), b"").unwrap();
    }
    std::fs::write(src.join("many/12345"), b"12345").unwrap();

    let first = server("one");
    let many = format!("{}/", src.join("many").display());
    let big_src = src.join("big.bin");
    let small_src = src.join("small.txt");
    for (key, what) in [
        ("proj/big", big_src.to_str().unwrap()),
        ("proj/small", small_src.to_str().unwrap()),
        ("proj/many", many.as_str()),
    ] {
        ok(&first, &["put", key, "--src", what]);
    }
    assert!(first.stop().success());
    let bucket = s3.root().join("kt-bucket/cluster/one");
    let count = |d: &str| std::fs::read_dir(bucket.join(d)).map_or(0, |r| r.count());
    assert!(count("blocks") >= 1, "the big file's blocks are objects");
    // The small files' blocks are in etcd: every object is a block of the big file.
    let sizes = |bucket: &Path| -> Vec<u64> {
        std::fs::read_dir(bucket.join("blocks")).map_or(Vec::new(), |r| {
            r.map(|e| e.unwrap().metadata().unwrap().len()).collect()
        })
    };
    assert!(
        sizes(&bucket).iter().all(|&n| n > 16 << 10),
        "a small block was written as an object: {:?}",
        sizes(&bucket)
    );
    let largest = std::fs::read_dir(bucket.join("manifests"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .max()
        .unwrap();
    assert!(
        largest > 3 << 19,
        "no manifest over etcd's limit: {largest} bytes"
    );
    // The small manifests (the big file's few blocks, the small file's one) stay in etcd, in
    // the transaction that publishes them: only the tree's is an object.
    assert_eq!(
        count("manifests"),
        1,
        "small manifests were written as objects"
    );
    assert!(
        !dir.path().join("one/blocks").exists(),
        "a block was written to the server's own disk"
    );

    // Another server, its data directory empty: everything it serves is etcd's and S3's.
    let second = server("two");
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    for key in ["proj/big", "proj/small", "proj/many"] {
        ok(&second, &["get", key, "--dest", out.to_str().unwrap()]);
    }
    assert!(std::fs::read(out.join("big")).unwrap() == big);
    assert_eq!(std::fs::read(out.join("small")).unwrap(), b"hello s3\n");
    assert_eq!(
        std::fs::read_dir(out.join("many")).unwrap().count(),
        files + 1
    );
    assert_eq!(std::fs::read(out.join("many/12345")).unwrap(), b"12345");

    // With no room for blocks in the metadata, a small one is an object, read back as one.
    let zero_url = s3.url("kt-bucket", "cluster/zero");
    let zero = replica_on(
        ip,
        (&etcd, "kt-zero"),
        (&s3, &zero_url),
        &dir.path().join("zero"),
        &["--meta-blocks-under", "0"],
    );
    ok(
        &zero,
        &["put", "z/small", "--src", small_src.to_str().unwrap()],
    );
    assert_eq!(sizes(&s3.root().join("kt-bucket/cluster/zero")), vec![9]);
    let z = dir.path().join("z");
    ok(&zero, &["get", "z/small", "--dest", z.to_str().unwrap()]);
    assert_eq!(std::fs::read(&z).unwrap(), b"hello s3\n");

    // Credentials the object store refuses: no server.
    let err = refused_server(
        ip,
        &dir.path().join("three"),
        &["--meta", &etcd.url("kt-s3"), "--blocks", &blocks],
        &[
            ("AWS_ACCESS_KEY_ID", "nobody"),
            ("AWS_SECRET_ACCESS_KEY", "wrong"),
        ],
    );
    assert!(
        err.contains("object store s3://kt-bucket/cluster/one"),
        "{err}"
    );

    // Ready (grpc.health.v1, no token; and `GET /ready`, an HTTP probe's) while etcd and S3
    // answer; not while S3 is gone.
    let ready = || common::http_get(&second.addr, "/ready");
    assert_eq!(health(&second.addr), SERVING);
    assert!(ready().starts_with("HTTP/1.1 200"), "{}", ready());
    s3.proc.kill();
    assert!(
        test_support::eventually(Duration::from_secs(20), || health(&second.addr)
            == NOT_SERVING),
        "still ready with its object store gone"
    );
    assert!(ready().starts_with("HTTP/1.1 503"), "{}", ready());
}

const SERVING: i32 = 1;
const NOT_SERVING: i32 = 2;

/// The store server's overall health status (grpc.health.v1, service ""), as a probe asks.
fn health(addr: &str) -> i32 {
    use tonic_health::pb::{health_client::HealthClient, HealthCheckRequest};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = HealthClient::new(channel);
        let req = HealthCheckRequest {
            service: String::new(),
        };
        client.check(req).await.unwrap().into_inner().status
    })
}

/// `kt server migrate` copies a stopped single server's data directory into etcd and S3: a
/// server on those, its own data directory empty, serves every key byte for byte, and a second
/// run copies the same again. A data directory its server still holds, or one that holds no
/// store, is refused.
#[test]
fn a_single_servers_store_migrates_into_etcd_and_s3() {
    let ip = "127.0.0.129";
    let etcd = Etcd::start(ip);
    let s3 = S3::start(ip, "kt-bucket");
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-agent.sock");
    let (meta, blocks) = (etcd.url("kt-migrated"), s3.url("kt-bucket", "migrated"));
    let kt_server = |args: &[&str]| {
        let mut cmd = std::process::Command::new(common::kt_bin());
        cmd.arg("server")
            .args(args)
            .envs(s3.env())
            .env("RUST_LOG", "warn");
        cmd
    };
    let single_dir = dir.path().join("single");
    let single_dir = single_dir.to_str().unwrap();
    let migrate = |from: &str| {
        kt_server(&[
            "migrate", "--from", from, "--meta", &meta, "--blocks", &blocks, "--json",
        ])
        .output()
        .unwrap()
    };
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    let big = pseudo_random(5 << 20, 51);
    std::fs::write(src.join("sub/big.bin"), &big).unwrap();
    std::fs::write(src.join("small.txt"), b"migrated\n").unwrap();
    let tree = format!("{}/", src.display());
    let small = src.join("small.txt");

    let single = test_support::spawn_ready(kt_server(&[
        "--listen",
        &format!("{ip}:0"),
        "--data-dir",
        single_dir,
    ]));
    ok_with(&single, &none, &["put", "proj/tree", "--src", &tree]);
    ok_with(
        &single,
        &none,
        &["put", "proj/one", "--src", small.to_str().unwrap()],
    );
    let held = migrate(single_dir);
    assert!(!held.status.success(), "migrated a store its server holds");
    let err = String::from_utf8_lossy(&held.stderr);
    assert!(err.contains("still running"), "{err}");
    assert!(single.stop().success());

    let mut copied = None;
    for _ in 0..2 {
        let out = migrate(single_dir);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(report["blocks"].as_u64().unwrap() >= 2, "{report}");
        assert!(report["entries"].as_u64().unwrap() >= 4, "{report}");
        assert!(copied.is_none_or(|c| c == report), "{report}");
        copied = Some(report);
    }

    let replica = test_support::spawn_ready(kt_server(&[
        "--listen",
        &format!("{ip}:0"),
        "--data-dir",
        dir.path().join("replica").to_str().unwrap(),
        "--meta",
        &meta,
        "--blocks",
        &blocks,
    ]));
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    for key in ["proj/tree", "proj/one"] {
        ok_with(
            &replica,
            &none,
            &["get", key, "--dest", out.to_str().unwrap()],
        );
    }
    assert!(std::fs::read(out.join("tree/sub/big.bin")).unwrap() == big);
    assert_eq!(std::fs::read(out.join("one")).unwrap(), b"migrated\n");
    // A key only cluster mode has seen.
    let later = dir.path().join("later.bin");
    std::fs::write(&later, pseudo_random(300 << 10, 52)).unwrap();
    ok_with(
        &replica,
        &none,
        &["put", "proj/later", "--src", later.to_str().unwrap()],
    );
    // Not while a server serves the store: a copy of a store being written is none.
    let back_to = |to: &Path| {
        kt_server(&["migrate", "--to", to.to_str().unwrap(), "--meta", &meta])
            .args(["--blocks", &blocks, "--json"])
            .output()
            .unwrap()
    };
    let served = back_to(&dir.path().join("busy"));
    assert!(!served.status.success(), "migrated a store a server serves");
    let err = String::from_utf8_lossy(&served.stderr);
    assert!(
        err.contains("serves") && err.contains(&replica.addr),
        "{err}"
    );
    // A server that stops gives its claim up: the store is free at once.
    assert!(replica.stop().success());

    // And back: etcd and S3 into a data directory a single server serves alone.
    let back_dir = dir.path().join("back");
    let back = back_to(&back_dir);
    assert!(
        back.status.success(),
        "{}",
        String::from_utf8_lossy(&back.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&back.stdout).unwrap();
    assert!(report["blocks"].as_u64().unwrap() >= 3, "{report}");
    let mut alone = std::process::Command::new(common::kt_bin());
    alone
        .args(["server", "--listen", &format!("{ip}:0"), "--data-dir"])
        .arg(&back_dir);
    let single = test_support::spawn_ready(alone);
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    for key in ["proj/tree", "proj/one", "proj/later"] {
        ok_with(
            &single,
            &none,
            &["get", key, "--dest", home.to_str().unwrap()],
        );
    }
    assert!(std::fs::read(home.join("tree/sub/big.bin")).unwrap() == big);
    assert_eq!(std::fs::read(home.join("one")).unwrap(), b"migrated\n");
    assert!(std::fs::read(home.join("later")).unwrap() == std::fs::read(&later).unwrap());
    drop(single);

    let nothing = dir.path().join("nothing");
    let refused = migrate(nothing.to_str().unwrap());
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("holds no store"), "{err}");
}

/// etcd full (its NOSPACE alarm, past `--quota-backend-bytes`) is a full disk to writers: a
/// put fails as `no_space` (ENOSPC through a mount), says the metadata is out of space, and
/// leaves nothing half there; reads go on. A prefix a newer ktfs wrote (its layout's number,
/// beside the tables) is refused at the server's start.
#[test]
fn a_full_etcd_is_no_space_to_writers_and_a_newer_layout_is_refused_at_the_start() {
    let ip = "127.0.0.134";
    let etcd = Etcd::start_with_quota(ip, 2 << 20);
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-agent.sock");
    // The layout's number, as a newer build would leave it.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use ktfs::meta::engine::{EtcdEngine, MetaEngine, Txn};
        let url = etcd.url("newer").parse().unwrap();
        let engine = EtcdEngine::connect(&url).await.unwrap();
        let newer = (ktfs::meta::engine::SCHEMA + 1).to_string();
        engine.txn(Txn::new().put("schema", newer)).await.unwrap();
    });
    let refused = refused_server(
        ip,
        &dir.path().join("two"),
        &["--meta", &etcd.url("newer")],
        &[],
    );
    assert!(refused.contains("newer ktfs"), "{refused}");

    let server = server_on(ip, &dir.path().join("one"), &etcd.url("full"));
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for i in 0..2000 {
        let name = format!("a-file-with-a-name-long-enough-to-weigh-in-the-manifest-{i:05}");
        std::fs::write(src.join(name), format!("{i}")).unwrap();
    }
    let mut failure = None;
    for round in 0..40 {
        // Another version each round: a manifest of its own.
        std::fs::write(src.join("round"), format!("{round}")).unwrap();
        let key = format!("tree/{round}");
        let out = kt_with(
            &server.addr,
            &none,
            &[
                "put",
                &key,
                "--src",
                &format!("{}/", src.display()),
                "--json",
            ],
        );
        if !out.status.success() {
            failure = Some((key, out));
            break;
        }
    }
    let (key, out) = failure.expect("etcd never filled");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["error"]["kind"], "no_space", "{json}");
    assert_eq!(out.status.code(), Some(1));
    let message = json["error"]["message"].as_str().unwrap();
    assert!(message.contains("out of space"), "{message}");
    // Reads go on; the refused key is not there.
    let listed = ok_with(&server, &none, &["ls", "tree", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let names = common::ls_names(&listed);
    assert!(!names.is_empty() && !names.contains(&key.replace("tree/", "")));
    drop(server);
}

/// etcd with authentication on: a store server given a user and password in its address
/// (`etcd://USER:PASSWORD@HOST:PORT/PREFIX`, a user whose role may read and write PREFIX/ only)
/// serves; a wrong password, or none, stops it at its start with an error that says so.
#[test]
fn a_store_reaches_an_etcd_with_authentication_as_the_user_its_address_names() {
    let ip = "127.0.0.135";
    let etcd = Etcd::start(ip);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use etcd_client::{Client, Permission};
        let mut c = Client::connect([etcd.endpoint.as_str()], None)
            .await
            .unwrap();
        c.role_add("root").await.unwrap();
        c.user_add("root", "root-pw", None).await.unwrap();
        c.user_grant_role("root", "root").await.unwrap();
        c.role_add("kt").await.unwrap();
        c.role_grant_permission("kt", Permission::read_write("kt-auth/").with_prefix())
            .await
            .unwrap();
        c.user_add("kt", "s3cret", None).await.unwrap();
        c.user_grant_role("kt", "kt").await.unwrap();
        c.auth_enable().await.unwrap();
    });
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-agent.sock");
    let with = |user: &str| format!("etcd://{user}{}/kt-auth", etcd.endpoint);
    let server = server_on(ip, &dir.path().join("one"), &with("kt:s3cret@"));
    let file = dir.path().join("f");
    std::fs::write(&file, b"behind a password\n").unwrap();
    ok_with(
        &server,
        &none,
        &["put", "k", "--src", file.to_str().unwrap()],
    );
    let got = dir.path().join("got");
    ok_with(
        &server,
        &none,
        &["get", "k", "--dest", got.to_str().unwrap()],
    );
    assert_eq!(std::fs::read(&got).unwrap(), b"behind a password\n");
    drop(server);

    for (user, says) in [("kt:wrong@", "authentication"), ("", "user name")] {
        let refused = refused_server(ip, &dir.path().join("two"), &["--meta", &with(user)], &[]);
        assert!(refused.to_lowercase().contains(says), "{user}: {refused}");
    }
}

/// Several replicas of one store (cluster mode): one owns it and serves, the others stand by
/// and name it; when the owner dies a standby takes over and a client that names every
/// replica (`KT_SERVER=a,b`) goes on, losing nothing, a mount's reads and writes too; an owner that was paused past its claim
/// stops once it learns another took over; and a replica restarted on its data directory takes
/// its own dead claim back at once rather than wait for it to run out.
#[test]
fn replicas_on_etcd_take_over_from_a_dead_owner_and_a_deposed_one_stops() {
    test_support::require_fuse();
    let ip = "127.0.0.136";
    let etcd = Etcd::start(ip);
    let s3 = S3::start(ip, "kt-bucket");
    let blocks = s3.url("kt-bucket", "replicas");
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-agent.sock");
    let replica = |data: &str, ttl: &str| {
        let at = dir.path().join(data);
        let ttl = ["--owner-ttl-secs", ttl];
        replica_on(ip, (&etcd, "kt-rep"), (&s3, &blocks), &at, &ttl)
    };
    let ok = |servers: &str, args: &[&str]| {
        let out = kt_with(servers, &none, args);
        assert!(
            out.status.success(),
            "kt {args:?} at {servers}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let files: Vec<_> = (0..3)
        .map(|i| {
            let f = dir.path().join(format!("f{i}"));
            std::fs::write(&f, pseudo_random((1 << 20) + i, 60 + i as u64)).unwrap();
            f
        })
        .collect();
    let put = |servers: &str, i: usize| {
        let key = format!("rep/k{i}");
        ok(servers, &["put", &key, "--src", files[i].to_str().unwrap()]);
    };

    let a = replica("a", "2");
    let b = replica("b", "2");
    let both = format!("{},{}", a.addr, b.addr);
    put(&both, 0);
    // The standby writes nothing itself, and says where the owner is.
    let refused = kt_with(
        &b.addr,
        &none,
        &["put", "rep/by-b", "--src", files[1].to_str().unwrap()],
    );
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("stands by") && err.contains(&a.addr), "{err}");

    // A mount of both replicas reads a key whole.
    let mount = common::start_mount(ip, &both, &dir.path().join("node"), "rep-node", &[]);
    let k0 = std::fs::read(&files[0]).unwrap();
    assert!(std::fs::read(mount.path("rep/k0")).unwrap() == k0);

    // The owner dies: the next put through either replica waits for B to take over.
    a.kill();
    put(&both, 1);
    // The mount goes on: what it read, what was published since, and a write of its own.
    assert!(std::fs::read(mount.path("rep/k0")).unwrap() == k0);
    let k1 = std::fs::read(&files[1]).unwrap();
    assert!(
        test_support::eventually(Duration::from_secs(20), || std::fs::read(
            mount.path("rep/k1")
        )
        .is_ok_and(|b| b == k1)),
        "the mount never saw the key published after the takeover"
    );
    std::fs::write(mount.path("rep/written"), b"through the new owner\n").unwrap();
    drop(mount);
    let dest = dir.path().join("written");
    ok(
        &both,
        &["get", "rep/written", "--dest", dest.to_str().unwrap()],
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"through the new owner\n");
    let out = dir.path().join("out");
    for (i, file) in files.iter().enumerate().take(2) {
        let dest = out.join(format!("k{i}"));
        ok(
            &both,
            &[
                "get",
                &format!("rep/k{i}"),
                "--dest",
                dest.to_str().unwrap(),
            ],
        );
        assert!(std::fs::read(&dest).unwrap() == std::fs::read(file).unwrap());
    }

    // B is paused past its claim's time: C takes over, and B, let go on, stops rather than
    // serve or write as an owner it no longer is.
    let mut c = replica("c", "30");
    // SAFETY: signalling our own child, not yet reaped.
    unsafe { libc::kill(b.pid() as i32, libc::SIGSTOP) };
    let c_owns = test_support::eventually(Duration::from_secs(30), || {
        kt_with(&c.addr, &none, &["ls", "rep"]).status.success()
    });
    assert!(c_owns, "C never took over from the paused owner");
    let c_first = format!("{},{}", c.addr, b.addr);
    put(&c_first, 2);
    unsafe { libc::kill(b.pid() as i32, libc::SIGCONT) };
    let mut b = b;
    let stopped = test_support::eventually(Duration::from_secs(20), || {
        matches!(b.child.try_wait(), Ok(Some(_)))
    });
    assert!(stopped, "the deposed owner still runs");
    assert!(!b.child.wait().unwrap().success());

    // C is killed and restarted on its data directory: it takes its dead claim back at once
    // (its claim's time is 30 s), so a client of it alone is served from its first call.
    let _ = c.child.kill();
    let _ = c.child.wait();
    drop(c);
    let c = replica("c", "30");
    let listed = ok(&c.addr, &["ls", "rep", "--json"]);
    for i in 0..3 {
        assert!(listed.contains(&format!("k{i}")), "{listed}");
    }
    let dest = out.join("k2");
    ok(
        &c.addr,
        &["get", "rep/k2", "--dest", dest.to_str().unwrap()],
    );
    assert!(std::fs::read(&dest).unwrap() == std::fs::read(&files[2]).unwrap());
}

/// Replicas with authentication: a client without the token is refused by both; they share
/// the ticket secret, so a ticket one gave reads blocks at the other's data plane; and an
/// authenticated mount reads on through the owner's death.
#[test]
fn authenticated_replicas_honour_each_others_tickets_and_a_mount_reads_through_the_owners_death() {
    test_support::require_fuse();
    let ip = "127.0.0.30";
    let etcd = Etcd::start(ip);
    let s3 = S3::start(ip, "kt-bucket");
    let blocks = s3.url("kt-bucket", "auth");
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-agent.sock");
    let token = dir.path().join("token");
    std::fs::write(&token, "shared-token\n").unwrap();
    let secret = dir.path().join("ticket-secret");
    std::fs::write(&secret, pseudo_random(48, 77)).unwrap();
    let replica = |data: &str| {
        let at = dir.path().join(data);
        let (token, secret) = (token.to_str().unwrap(), secret.to_str().unwrap());
        let auth = [
            "--owner-ttl-secs",
            "2",
            "--token-file",
            token,
            "--ticket-secret",
            secret,
        ];
        replica_on(ip, (&etcd, "kt-auth"), (&s3, &blocks), &at, &auth)
    };
    let a = replica("a");
    let b = replica("b");
    let both = format!("{},{}", a.addr, b.addr);
    let with_token = [("KT_TOKEN_FILE", token.to_str().unwrap())];
    // Several blocks each, so a read goes over the data plane with a ticket, not inline.
    let files: Vec<_> = (0..3)
        .map(|i| {
            let f = dir.path().join(format!("f{i}"));
            std::fs::write(&f, pseudo_random((9 << 20) + i, 90 + i as u64)).unwrap();
            f
        })
        .collect();
    let put = |i: usize| {
        let key = format!("auth/k{i}");
        let out = common::kt_env(
            &both,
            &none,
            &with_token,
            &["put", &key, "--src", files[i].to_str().unwrap()],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    put(0);
    // A client that lists the standby first uploads its blocks to the standby's data plane
    // (any replica takes them), on the owner's ticket, and publishes at the owner: the
    // namespace's references to what it uploaded are the store's, not the standby's.
    let standby_first = format!("{},{}", b.addr, a.addr);
    let out = common::kt_env(
        &standby_first,
        &none,
        &with_token,
        &["put", "auth/k1", "--src", files[1].to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "a put through the standby: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for server in [&a.addr, &b.addr] {
        let out = common::kt_env(server, &none, &[("KT_TOKEN", "guess")], &["ls", "auth"]);
        assert!(
            !out.status.success(),
            "{server} served a caller without the token"
        );
    }
    // A client that lists the standby first is sent to the owner for the key, and fetches the
    // blocks from the standby's data plane, on the ticket the owner gave.
    let dest = dir.path().join("got");
    let out = common::kt_env(
        &standby_first,
        &none,
        &with_token,
        &["get", "auth/k0", "--dest", dest.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::read(&dest).unwrap() == std::fs::read(&files[0]).unwrap());
    let mount = common::start_mount(
        ip,
        &both,
        &dir.path().join("node"),
        "auth-node",
        &["--token-file", token.to_str().unwrap()],
    );
    assert!(std::fs::read(mount.path("auth/k0")).unwrap() == std::fs::read(&files[0]).unwrap());

    // The owner dies. k1, never read on the node, comes from the new owner's data plane on the
    // ticket the first one gave; k2 is published through it.
    a.kill();
    put(2);
    for i in [1, 2] {
        let want = std::fs::read(&files[i]).unwrap();
        let read = test_support::eventually(Duration::from_secs(20), || {
            std::fs::read(mount.path(&format!("auth/k{i}"))).is_ok_and(|got| got == want)
        });
        assert!(read, "k{i} was not read after the takeover");
    }
}

/// A replica that stands by answers the reads of callers without a lease (`kt ls`, `kt get`)
/// from etcd, naming the sources the owner would: a key published in place on a node is got
/// through the standby alone, from that node, whose lease the standby reads in etcd; once the
/// node is gone, its lease runs out there too and the standby names it no more. A read with
/// a lease (a mount's, which its watch covers) stays the owner's.
#[test]
fn a_standby_answers_lease_free_reads_with_the_nodes_the_owner_knows() {
    let ip = "127.0.0.31";
    let etcd = Etcd::start(ip);
    let s3 = S3::start(ip, "kt-bucket");
    let blocks = s3.url("kt-bucket", "reads");
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-agent.sock");
    let replica = |data: &str| {
        let at = dir.path().join(data);
        let short = ["--owner-ttl-secs", "2", "--lease-secs", "3"];
        replica_on(ip, (&etcd, "kt-reads"), (&s3, &blocks), &at, &short)
    };
    let a = replica("a");
    let b = replica("b");
    let both = format!("{},{}", a.addr, b.addr);
    let stored = dir.path().join("stored");
    std::fs::write(&stored, pseudo_random(300_000, 31)).unwrap();
    let local = dir.path().join("local");
    std::fs::write(&local, pseudo_random(200_000, 32)).unwrap();
    let agent = common::start_agent(ip, &both, &dir.path().join("n1"), "reads-n1");
    let put = |sock: &Path, key: &str, src: &Path, extra: &[&str]| {
        let mut args = vec!["put", key, "--src", src.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = kt_with(&both, sock, &args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    put(&none, "reads/stored", &stored, &[]);
    put(&agent.socket, "reads/local", &local, &["--locale", "local"]);

    // The standby alone lists, and gets each key: the stored one from the object store, the
    // local one from the node that published it.
    let listed = ok_with(&b, &none, &["ls", "reads", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(common::ls_names(&listed), ["local", "stored"]);
    let got = dir.path().join("got-stored");
    ok_with(
        &b,
        &none,
        &["get", "reads/stored", "--dest", got.to_str().unwrap()],
    );
    assert!(std::fs::read(&got).unwrap() == std::fs::read(&stored).unwrap());
    let got = dir.path().join("got-local");
    let from_node = ok_with(
        &b,
        &none,
        &[
            "get",
            "reads/local",
            "--dest",
            got.to_str().unwrap(),
            "--json",
        ],
    );
    let from_node: serde_json::Value = serde_json::from_str(&from_node).unwrap();
    assert_eq!(
        common::listed_sources(&from_node),
        ["reads-n1"],
        "{from_node}"
    );
    assert!(std::fs::read(&got).unwrap() == std::fs::read(&local).unwrap());

    // A read that asks for a lease (a mount's, naming its watch) is the owner's: the standby
    // refuses it, naming the owner, and answers the same read without one.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (leased, lease_free) = rt.block_on(async {
        let store = ktfs::rpc::client::connect_store(&b.addr, &ktfs::auth::Credential::none())
            .await
            .unwrap();
        let read = |watcher| ktfs::proto::ResolveRequest {
            watcher,
            namespace: "default".into(),
            key: "reads/stored".into(),
            inline_up_to: 0,
        };
        (store.resolve(read(7)).await, store.resolve(read(0)).await)
    });
    let refused = leased.expect_err("the standby answered a read with a lease");
    assert!(refused.to_string().contains("stands by"), "{refused}");
    match refused {
        ktfs::rpc::ClientError::Remote(r) => assert_eq!(r.owner.as_deref(), Some(&*a.addr)),
        other => panic!("{other}"),
    }
    assert!(lease_free.is_ok_and(|r| r.key == "reads/stored"));

    // The node dies: its lease runs out in etcd, and the standby names no source for it.
    drop(agent);
    let got = dir.path().join("got-after");
    let gone = test_support::eventually(Duration::from_secs(15), || {
        let out = kt_with(
            &b.addr,
            &none,
            &["get", "reads/local", "--dest", got.to_str().unwrap()],
        );
        assert!(!out.status.success(), "a get from a dead node succeeded");
        String::from_utf8_lossy(&out.stderr).contains("no source holds this version")
    });
    assert!(gone, "the standby still names the dead node");
}

/// Backup and restore (issue 44): an etcd snapshot, restored after its keys were removed and
/// collection ran, brings back keys whose manifests and blocks are still in the object store,
/// because the server keeps what collection finds dead for its grace (`--gc-grace-secs`, set
/// to at least the backups' age); once the grace is over, what is dead goes.
#[test]
fn an_etcd_snapshot_restores_to_keys_whose_blocks_the_grace_kept() {
    let ip = "127.0.0.32";
    let etcd = Etcd::start(ip);
    let s3 = S3::start(ip, "kt-bucket");
    let blocks = s3.url("kt-bucket", "backup");
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-agent.sock");
    let server = |etcd: &Etcd, data: &str| {
        let at = dir.path().join(data);
        let gc = ["--gc-interval-secs", "1", "--gc-grace-secs", "10"];
        replica_on(ip, (etcd, "kt-backup"), (&s3, &blocks), &at, &gc)
    };
    let passes = |s: &Proc, n: f64| {
        let from = common::metric(&s.addr, "kt_gc_passes_total");
        assert!(
            test_support::eventually(Duration::from_secs(20), || {
                common::metric(&s.addr, "kt_gc_passes_total") >= from + n
            }),
            "collection does not run"
        );
    };
    let a = server(&etcd, "a");
    let kept = dir.path().join("kept");
    std::fs::write(&kept, pseudo_random(300_000, 41)).unwrap();
    ok_with(
        &a,
        &none,
        &["put", "backup/kept", "--src", kept.to_str().unwrap()],
    );
    let snapshot = dir.path().join("snapshot.db");
    etcd.snapshot(&snapshot);

    // After the backup the key is removed, another is put, and collection runs: a pass that
    // finds the removed version touched lately, then passes that find it dead.
    ok_with(&a, &none, &["rm", "backup/kept"]);
    let later = dir.path().join("later");
    std::fs::write(&later, pseudo_random(200_000, 42)).unwrap();
    ok_with(
        &a,
        &none,
        &["put", "backup/later", "--src", later.to_str().unwrap()],
    );
    ok_with(&a, &none, &["rm", "backup/later"]);
    passes(&a, 3.0);
    drop(a);
    drop(etcd);

    // etcd restored from the backup, and a server on it: the key as it was, whole.
    let etcd = Etcd::restore(ip, &snapshot);
    let b = server(&etcd, "b");
    let listed = ok_with(&b, &none, &["ls", "backup", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(common::ls_names(&listed), ["kept"]);
    let got = dir.path().join("got");
    ok_with(
        &b,
        &none,
        &["get", "backup/kept", "--dest", got.to_str().unwrap()],
    );
    assert!(std::fs::read(&got).unwrap() == std::fs::read(&kept).unwrap());

    // Removed again, its blocks go once the grace is over, with those of the key the backup
    // never knew. (The dead owner's claim came back with the backup: the new server stands by
    // until the claim's lease runs out, answering reads meanwhile.)
    assert!(
        test_support::eventually(Duration::from_secs(20), || {
            kt_with(&b.addr, &none, &["rm", "backup/kept"])
                .status
                .success()
        }),
        "the restored store never took a write"
    );
    let objects = s3.root().join("kt-bucket/backup/blocks");
    let count = || std::fs::read_dir(&objects).map_or(0, |r| r.count());
    assert!(count() >= 2);
    assert!(
        test_support::eventually(Duration::from_secs(40), || count() == 0),
        "collection kept dead blocks past their grace"
    );
}

/// A store on a three-member etcd goes on through the `kill -9` of etcd's leader: every put of
/// four writers succeeds, none waits out etcd's own timeout of an unanswered request (10 s with
/// these members' election timeout of 2.5 s), and every key reads back. The store's member is
/// a follower, where a request in flight when its leader dies gets no answer: before, such a
/// put waited 10 s, and while the owner could not renew its claim (the election) its calls
/// were refused at once, so a client of this one server failed.
#[test]
fn a_store_on_three_etcd_members_rides_out_the_kill_of_their_leader() {
    let ips = ["127.0.0.204", "127.0.0.205", "127.0.0.206"];
    let mut members = test_support::etcd::cluster(&ips);
    let leader = test_support::etcd::leader(&members);
    // A follower first: the member the server asks until it fails.
    let mut order: Vec<usize> = (0..ips.len()).filter(|&i| i != leader).collect();
    order.push(leader);
    let endpoints: Vec<String> = order.iter().map(|&i| format!("{}:2379", ips[i])).collect();
    let meta = format!("etcd://{}/kt-lead", endpoints.join(","));
    let dir = tempfile::tempdir().unwrap();
    let server = server_on("127.0.0.208", &dir.path().join("data"), &meta);
    let none = dir.path().join("no-agent.sock");

    let stop = std::sync::atomic::AtomicBool::new(false);
    let results = std::thread::scope(|s| {
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let (server, none, dir, stop) = (&server, &none, dir.path(), &stop);
                s.spawn(move || {
                    let mut done = Vec::new();
                    for j in 0.. {
                        if stop.load(std::sync::atomic::Ordering::Relaxed) {
                            break;
                        }
                        let src = dir.join(format!("w{w}-{j}"));
                        std::fs::write(&src, pseudo_random(4096, (w * 1000 + j) as u64)).unwrap();
                        let key = format!("lead/w{w}/k{j}");
                        let began = Instant::now();
                        let out = kt_with(
                            &server.addr,
                            none,
                            &["put", &key, "--src", src.to_str().unwrap()],
                        );
                        done.push((key, src, began.elapsed(), out));
                    }
                    done
                })
            })
            .collect();
        // Puts are going on when the leader dies, and for 12 s after.
        std::thread::sleep(Duration::from_secs(2));
        members.remove(leader).proc.kill();
        std::thread::sleep(Duration::from_secs(12));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert!(results.len() >= 8, "{} puts in 14 s", results.len());
    let longest = results.iter().map(|r| r.2).max().unwrap();
    for (key, _, took, out) in &results {
        assert!(
            out.status.success(),
            "put {key} failed after {took:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(longest < Duration::from_secs(9), "a put took {longest:?}");
    for (key, src, _, _) in &results {
        let back = dir.path().join("back");
        ok_with(
            &server,
            &none,
            &["get", key, "--dest", back.to_str().unwrap()],
        );
        assert!(
            std::fs::read(&back).unwrap() == std::fs::read(src).unwrap(),
            "{key}"
        );
        std::fs::remove_file(&back).unwrap();
    }
}

/// The owner reads what it wrote itself from memory (only it writes the tables, under its
/// claim): a mount writing small files into one directory costs etcd 3 reads a file (what no
/// one read yet: the new key, whether anything lies below it), not 9, and what it reads back
/// is what was written.
#[test]
fn an_owner_reads_back_what_it_wrote_from_memory_not_from_etcd() {
    test_support::require_fuse();
    let ip = "127.0.0.209";
    let etcd = Etcd::start(ip);
    let dir = tempfile::tempdir().unwrap();
    let server = server_on(ip, &dir.path().join("data"), &etcd.url("kt-owned"));
    let mount = common::start_mount(ip, &server.addr, &dir.path().join("node"), "owned", &[]);
    std::fs::create_dir(mount.path("d")).unwrap();
    std::fs::write(mount.path("d/first"), b"warm").unwrap();
    let files = 40;
    let before = etcd.answered("Range");
    for i in 0..files {
        std::fs::write(mount.path(&format!("d/f{i}")), pseudo_random(4096, i)).unwrap();
    }
    let reads = etcd.answered("Range") - before;
    assert!(
        reads <= 5 * files,
        "{reads} reads of etcd for {files} files (3 a file; 9 without the owner's memory)"
    );
    for i in 0..files {
        let back = std::fs::read(mount.path(&format!("d/f{i}"))).unwrap();
        assert!(back == pseudo_random(4096, i), "d/f{i}");
    }
}

/// A broadcast whose owner dies goes on among its members, not from the store: the next owner
/// knows no such window (windows are the owner's memory), so each getter's sync finds none,
/// and each joins the window again there, telling the new board what it holds. Three slow
/// getters of 24 MiB, the owner killed once each has some of it: all finish byte-identical,
/// each joined again, the window at the new owner has all three, and the store sent about one
/// copy (each getter fetching the rest from the store, as before, costs nearly three).
#[test]
fn a_broadcasts_getters_join_their_window_again_at_the_next_owner() {
    use std::os::unix::fs::MetadataExt;
    let ip = "127.0.0.147";
    let etcd = Etcd::start(ip);
    let s3 = S3::start(ip, "kt-bucket");
    let blocks = s3.url("kt-bucket", "rejoin");
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-agent.sock");
    let replica = |data: &str| {
        let at = dir.path().join(data);
        let ttl = ["--owner-ttl-secs", "2"];
        replica_on(ip, (&etcd, "kt-rejoin"), (&s3, &blocks), &at, &ttl)
    };
    let a = replica("a");
    let b = replica("b");
    let both = format!("{},{}", a.addr, b.addr);
    let data = pseudo_random(24 << 20, 147);
    let src = dir.path().join("src");
    std::fs::write(&src, &data).unwrap();
    ok_with(
        &a,
        &none,
        &[
            "put",
            "fan/w",
            "--src",
            src.to_str().unwrap(),
            "--locale",
            "store",
        ],
    );

    let agents: Vec<_> = ["127.0.0.4", "127.0.0.59", "127.0.0.76"]
        .iter()
        .enumerate()
        .map(|(i, agent_ip)| {
            let at = dir.path().join(format!("node-{i}"));
            common::start_agent(agent_ip, &both, &at, &format!("node-{i}"))
        })
        .collect();
    // Each in a directory of its own, where the get's temporary file is the only one.
    let dests: Vec<_> = (0..3)
        .map(|i| {
            let d = dir.path().join(format!("got-{i}"));
            std::fs::create_dir(&d).unwrap();
            d.join("w")
        })
        .collect();
    let landed = |d: &Path| {
        let files = std::fs::read_dir(d.parent().unwrap()).unwrap();
        let bytes: u64 = files
            .filter_map(|f| f.ok()?.metadata().ok())
            .map(|m| m.blocks() * 512)
            .sum();
        bytes >= 2 << 20
    };
    let gets: Vec<_> = agents
        .iter()
        .zip(&dests)
        .map(|(agent, d)| {
            std::process::Command::new(common::kt_bin())
                .args([
                    "get",
                    "fan/w",
                    "-d",
                    d.to_str().unwrap(),
                    "--group-id",
                    "fan",
                ])
                .args(["--bwlimit", "4M", "--json"])
                .env("KT_SERVER", &both)
                .env("KT_AGENT", &agent.socket)
                .env_remove("KT_NAMESPACE")
                .env("RUST_LOG", "warn")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let window_at = |server: &str| -> Option<serde_json::Value> {
        let out = kt_with(server, &none, &["window", "fan", "--json"]);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).unwrap())
    };
    let members = |w: &Option<serde_json::Value>| {
        w.as_ref()
            .and_then(|w| w["members"].as_array().map(Vec::len))
            .unwrap_or(0)
    };
    // Every getter joined and has some of the bytes: the owner dies.
    let started = test_support::eventually(Duration::from_secs(60), || {
        dests.iter().all(|d| landed(d)) && members(&window_at(&a.addr)) == 3
    });
    assert!(
        started,
        "the getters never got going: {:?}",
        window_at(&a.addr)
    );
    a.kill();
    let reformed = test_support::eventually(Duration::from_secs(60), || {
        members(&window_at(&b.addr)) >= 3
    });
    if !reformed {
        let outs: Vec<_> = gets
            .into_iter()
            .map(|g| g.wait_with_output().unwrap())
            .collect();
        panic!(
            "the window never formed again at the next owner: {:?}; the getters: {:?}",
            window_at(&b.addr),
            outs
        );
    }

    let mut from_store = 0;
    for (get, d) in gets.into_iter().zip(&dests) {
        let got = common::finish_json(get);
        assert!(std::fs::read(d).unwrap() == data, "{} differs", d.display());
        let tree = &got["broadcast"][0];
        assert!(tree["rejoins"].as_u64() >= Some(1), "{got}");
        from_store += common::bytes_from(&got, "store");
    }
    assert!(
        from_store <= 2 * data.len() as u64,
        "the store sent {from_store} bytes of a {} byte version to three getters",
        data.len()
    );
}

/// Whether the replica at `addr` knows GPU window `group` of `generation` (a standby refuses).
async fn owns_window(addr: &str, group: &str, generation: u64) -> bool {
    let one = ktfs::rpc::client::connect_store(addr, &ktfs::auth::Credential::none())
        .await
        .unwrap();
    let asked = ktfs::proto::GpuAwaitRequest {
        group_id: group.to_string(),
        generation,
        until_finished: false,
        wait_ms: 0,
    };
    one.await_gpu_window(asked).await.is_ok()
}

/// A GPU window is the memory of the replica that owns the store (doc/cluster.md, Replicas).
/// Its members, driven here through the agent's own window calls (`gpu::window`, as a control
/// file's transfer plays them; the bytes between workers are not the store's), outlive two
/// owners' deaths: a window still forming forms again at the next owner from its members'
/// joins, and one whose quorum closed is taken up there from a member's copy and gathers every
/// getter's report, so that the putter's transfer ends as it would have.
#[test]
fn a_gpu_windows_members_form_it_again_and_finish_it_at_the_next_owner() {
    use ktfs::gpu::window::{self, Asked, Joining, Membership};
    use ktfs::proto::{Role, WindowSpec};
    use std::sync::atomic::AtomicBool;

    let ip = "127.0.0.148";
    let etcd = Etcd::start(ip);
    let s3 = S3::start(ip, "kt-bucket");
    let blocks = s3.url("kt-bucket", "gpu-rejoin");
    let dir = tempfile::tempdir().unwrap();
    let replica = |data: &str| {
        let at = dir.path().join(data);
        let ttl = ["--owner-ttl-secs", "2"];
        replica_on(ip, (&etcd, "kt-gpu-rejoin"), (&s3, &blocks), &at, &ttl)
    };
    let a = replica("a");
    let b = replica("b");
    let c = replica("c");
    let all = format!("{},{},{}", a.addr, b.addr, c.addr);
    // A member's node must be live: each node's agent keeps its lease through the replicas.
    let _agents: Vec<_> = ["127.0.0.5", "127.0.0.60", "127.0.0.77"]
        .iter()
        .enumerate()
        .map(|(i, agent_ip)| {
            let at = dir.path().join(format!("node-{i}"));
            common::start_agent(agent_ip, &all, &at, &format!("node-{i}"))
        })
        .collect();

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let credential = ktfs::auth::Credential::none();
        let store = ktfs::rpc::client::connect_store(&all, &credential)
            .await
            .unwrap();
        let asked = |group: &str| Asked {
            spec: WindowSpec {
                group_id: group.into(),
                world_size: 3,
                ..Default::default()
            },
            flags: 0,
        };
        let join = |group: &'static str, node: usize, role: Role| {
            let store = store.clone();
            async move {
                let asked = asked(group);
                let node_id = format!("node-{node}");
                let worker = format!("127.0.0.{}:9", 5 + node);
                window::join(
                    &store,
                    Joining {
                        namespace: "default",
                        key: "weights",
                        asked: &asked,
                        role,
                        node_id: &node_id,
                        worker_addr: &worker,
                        registration: 1 + node as u64,
                        digest: &[7; 32],
                        table_json: "{\"entries\": []}",
                        nccl: false,
                        unique_id: Vec::new(),
                        comms: Vec::new(),
                    },
                )
                .await
                .unwrap()
            }
        };
        let open = AtomicBool::new(false);
        fn within<F: std::future::Future>(f: F) -> tokio::time::Timeout<F> {
            tokio::time::timeout(Duration::from_secs(60), f)
        }

        // Forming: two members joined at the owner (a, the first started), which dies; the
        // third joins at the next, and the two find their window gone there and join again.
        let putter = join("forming", 0, Role::Putter).await;
        let first = join("forming", 1, Role::Getter).await;
        let (_, before, _) = first.at();
        a.kill();
        let last = join("forming", 2, Role::Getter).await;
        let plans = within(async {
            tokio::join!(
                putter.plan(&store, &open),
                first.plan(&store, &open),
                last.plan(&store, &open)
            )
        })
        .await
        .expect("the window never formed again at the next owner");
        let (p0, p1, p2) = (plans.0.unwrap(), plans.1.unwrap(), plans.2.unwrap());
        assert_eq!(p0.window.members.len(), 3, "{:?}", p0.window);
        assert!(
            p0.window.generation != before,
            "the next owner's window is its own"
        );
        for (m, p) in [(&putter, &p0), (&first, &p1), (&last, &p2)] {
            assert_eq!(m.at().1, p0.window.generation);
            assert_eq!(p.me.id, m.at().2);
        }
        assert!(p1.parent.is_some() && p2.parent.is_some() && p0.parent.is_none());

        // Closed: a whole window at the owner a's death made (b or c), one getter done, then
        // that owner dies while the other getter still moves its bytes. The last replica takes
        // the window up from the first member that reaches it and hears every report.
        let m: Vec<Membership> = vec![
            join("closed", 0, Role::Putter).await,
            join("closed", 1, Role::Getter).await,
            join("closed", 2, Role::Getter).await,
        ];
        for x in &m {
            within(x.plan(&store, &open)).await.unwrap().unwrap();
        }
        let generation = m[0].at().1;
        m[1].finish(&store, "").await;
        // Whichever of b and c took the store over from a owns the window: it dies.
        let (group, _, _) = m[0].at();
        let b_owns = owns_window(&b.addr, &group, generation).await;
        let c_owns = owns_window(&c.addr, &group, generation).await;
        assert!(b_owns != c_owns, "b owns it: {b_owns}, c: {c_owns}");
        let survivor = match b_owns {
            true => {
                b.kill();
                c
            }
            false => {
                c.kill();
                b
            }
        };
        let done = within(async {
            let second = async {
                m[2].finish(&store, "").await;
                m[2].served(&store, &open).await
            };
            tokio::join!(
                m[0].getters_done(&store, &open),
                m[1].served(&store, &open),
                second
            )
        })
        .await
        .expect("the getters' reports never reached the next owner");
        done.0
            .expect("the putter's transfer failed at the next owner");
        done.1.unwrap();
        done.2.unwrap();
        for x in &m {
            assert_eq!(x.at().1, generation, "the closed window was formed anew");
        }
        m[0].finish(&store, "").await;
        drop(survivor);
    });
}

/// The claims of the shards of the store at `prefix` on `etcd`: each shard's owner's address.
fn shard_owners(etcd: &Etcd, prefix: &str) -> std::collections::BTreeMap<u32, String> {
    let out = std::process::Command::new("etcdctl")
        .args(["--endpoints", &etcd.endpoint, "get", "--prefix"])
        .arg(format!("{prefix}/owner/"))
        .env("ETCDCTL_API", "3")
        .output()
        .expect("etcdctl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .chunks(2)
        .filter_map(|kv| {
            let shard = kv.first()?.rsplit('/').next()?.parse().ok()?;
            let addr = kv.get(1)?.split(' ').next()?.to_string();
            Some((shard, addr))
        })
        .collect()
}

/// Waits until the `count` shards of the store at `prefix` are all claimed, by the replicas
/// at `addrs` and each of them holding some.
fn shared_by(
    etcd: &Etcd,
    prefix: &str,
    count: usize,
    addrs: &std::collections::BTreeSet<String>,
) -> bool {
    test_support::eventually(Duration::from_secs(30), || {
        let owners = shard_owners(etcd, prefix);
        owners.len() == count
            && owners
                .values()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>()
                == *addrs
    })
}

/// A store whose namespaces fall into 8 shards, served by three replicas: each holds some
/// shards and writes their namespaces alone; a client of all three writes every namespace,
/// one of a single replica is refused a namespace of another's shard, told its owner; a mount
/// writes and reads its namespace through its owner; a replica killed, the others take its
/// shards, and everything written before and after reads back whole.
#[test]
fn replicas_of_a_store_in_shards_share_its_namespaces_and_take_a_dead_ones() {
    use ktfs::meta::engine::shard_of;
    test_support::require_fuse();
    let ip = "127.0.0.119";
    let etcd = Etcd::start(ip);
    let s3 = S3::start(ip, "kt-bucket");
    let blocks = s3.url("kt-bucket", "sharded");
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-agent.sock");
    let replica = |data: &str| {
        let at = dir.path().join(data);
        let extra = ["--shards", "8", "--owner-ttl-secs", "2"];
        replica_on(ip, (&etcd, "kt-sh"), (&s3, &blocks), &at, &extra)
    };
    let mut replicas = vec![replica("a"), replica("b"), replica("c")];
    let all = replicas
        .iter()
        .map(|p| p.addr.clone())
        .collect::<Vec<_>>()
        .join(",");
    let addrs: std::collections::BTreeSet<String> =
        replicas.iter().map(|p| p.addr.clone()).collect();
    let a_addr = replicas[0].addr.clone();
    // Every shard claimed, and each replica holding some.
    assert!(
        shared_by(&etcd, "kt-sh", 8, &addrs),
        "the shards: {:?}",
        shard_owners(&etcd, "kt-sh")
    );

    // A namespace in each shard, each written through the three.
    let namespaces: Vec<String> = (0..8)
        .map(|s| {
            (0..)
                .map(|i| format!("team-{i}"))
                .find(|ns| shard_of(ns, 8) == s)
                .unwrap()
        })
        .collect();
    let body = |ns: &str, k: &str| format!("{ns}/{k}: written\n").into_bytes();
    let put = |servers: &str, ns: &str, k: &str| {
        let f = dir.path().join(format!("{ns}-{k}"));
        std::fs::write(&f, body(ns, k)).unwrap();
        let out = kt_with(
            servers,
            &none,
            &["put", "-n", ns, k, "--src", f.to_str().unwrap()],
        );
        assert!(
            out.status.success(),
            "put {ns}/{k} at {servers}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let read_back = |servers: &str, ns: &str, k: &str| {
        let dest = dir.path().join(format!("got-{ns}-{k}"));
        let out = kt_with(
            servers,
            &none,
            &["get", "-n", ns, k, "--dest", dest.to_str().unwrap()],
        );
        assert!(
            out.status.success(),
            "get {ns}/{k}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(std::fs::read(&dest).unwrap(), body(ns, k), "{ns}/{k}");
    };
    for ns in &namespaces {
        put(&all, ns, "before");
    }

    // A's client alone: a namespace of another replica's shard is refused, naming its owner.
    let owners = shard_owners(&etcd, "kt-sh");
    let (s, elsewhere) = (0..8u32)
        .find(|s| owners[s] != a_addr)
        .map(|s| (s, &owners[&s]))
        .unwrap();
    let f = dir.path().join("refused");
    std::fs::write(&f, b"x").unwrap();
    let ns = &namespaces[s as usize];
    let refused = kt_with(
        &a_addr,
        &none,
        &["put", "-n", ns, "k", "--src", f.to_str().unwrap()],
    );
    assert!(!refused.status.success(), "a replica wrote another's shard");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains(&format!("shard {s} of 8")) && err.contains(elsewhere.as_str()),
        "{err}"
    );

    // A mount of one namespace writes and reads through its shard's owner.
    let mounted = &namespaces[0];
    let mount = common::start_mount(
        ip,
        &all,
        &dir.path().join("node"),
        "sh-node",
        &["--namespace", mounted],
    );
    std::fs::write(mount.path("by-mount"), b"through the shard's owner\n").unwrap();
    assert_eq!(
        std::fs::read(mount.path("before")).unwrap(),
        body(mounted, "before")
    );

    // The owner of the mount's shard is killed: its shards go to the two left, and the
    // mount reads and writes on.
    let victim = replicas.iter().position(|p| p.addr == owners[&0]).unwrap();
    replicas.remove(victim).kill();
    let left_addrs: std::collections::BTreeSet<String> =
        replicas.iter().map(|p| p.addr.clone()).collect();
    assert!(
        shared_by(&etcd, "kt-sh", 8, &left_addrs),
        "the dead replica's shards: {:?}",
        shard_owners(&etcd, "kt-sh")
    );
    for ns in &namespaces {
        put(&all, ns, "after");
    }
    assert_eq!(
        std::fs::read(mount.path("after")).unwrap(),
        body(mounted, "after")
    );
    std::fs::write(mount.path("by-mount-after"), b"through the next owner\n").unwrap();
    drop(mount);
    let survivors = replicas
        .iter()
        .map(|p| p.addr.clone())
        .collect::<Vec<_>>()
        .join(",");
    for ns in &namespaces {
        read_back(&survivors, ns, "before");
        read_back(&survivors, ns, "after");
    }
    let dest = dir.path().join("by-mount");
    let out = kt_with(
        &survivors,
        &none,
        &[
            "get",
            "-n",
            mounted,
            "by-mount-after",
            "--dest",
            dest.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"through the next owner\n");
}

/// Collection in a store in shards (three replicas, 8 shards, a pass a second): the first
/// shard's owner collects what every replica's writes left dead (a removed key's blocks),
/// keeps what any of them names, and a key whose TTL ran out is deleted from etcd by its own
/// shard's owner, which is not the collector.
#[test]
fn replicas_of_a_store_in_shards_collect_together() {
    use ktfs::meta::engine::shard_of;
    let ip = "127.0.0.137";
    let etcd = Etcd::start(ip);
    let s3 = S3::start(ip, "kt-bucket");
    let blocks = s3.url("kt-bucket", "shared-gc");
    let dir = tempfile::tempdir().unwrap();
    let none = dir.path().join("no-agent.sock");
    let replica = |data: &str| {
        let at = dir.path().join(data);
        let extra = [
            "--shards",
            "8",
            "--owner-ttl-secs",
            "2",
            "--gc-interval-secs",
            "1",
        ];
        replica_on(ip, (&etcd, "kt-gcs"), (&s3, &blocks), &at, &extra)
    };
    let replicas = [replica("a"), replica("b"), replica("c")];
    let addrs: std::collections::BTreeSet<String> =
        replicas.iter().map(|p| p.addr.clone()).collect();
    assert!(shared_by(&etcd, "kt-gcs", 8, &addrs));
    let all = addrs.iter().cloned().collect::<Vec<_>>().join(",");
    let owners = shard_owners(&etcd, "kt-gcs");
    // Namespaces of shards other than the first (whose owner collects), one of them held by
    // another replica than the collector.
    let collector = owners[&0].clone();
    let in_shard = |s: u32| {
        (0..)
            .map(|i| format!("gc-{i}"))
            .find(|ns| shard_of(ns, 8) == s)
            .unwrap()
    };
    let elsewhere = (1..8)
        .find(|s| owners[s] != collector)
        .expect("a shard the collector does not hold");
    let (kept_ns, dropped_ns, brief_ns) = (in_shard(0), in_shard(elsewhere), in_shard(elsewhere));
    let put = |ns: &str, key: &str, seed: u64, extra: &[&str]| {
        let f = dir.path().join(format!("{ns}-{key}"));
        std::fs::write(&f, pseudo_random(300_000, seed)).unwrap();
        let mut args = vec!["put", "-n", ns, key, "--src", f.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = kt_with(&all, &none, &args);
        assert!(
            out.status.success(),
            "put {ns}/{key}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        f
    };
    let kept = put(&kept_ns, "kept", 61, &[]);
    put(&dropped_ns, "dropped", 62, &[]);
    put(&brief_ns, "brief", 63, &["--ttl", "1"]);
    let objects = s3.root().join("kt-bucket/shared-gc/blocks");
    let count = || std::fs::read_dir(&objects).map_or(0, |r| r.count());
    assert_eq!(count(), 3);
    let rm = kt_with(&all, &none, &["rm", "-n", &dropped_ns, "dropped"]);
    assert!(
        rm.status.success(),
        "{}",
        String::from_utf8_lossy(&rm.stderr)
    );

    // The removed key's block and the expired key's go; the live key's stays.
    assert!(
        test_support::eventually(Duration::from_secs(60), || count() == 1),
        "blocks left: {}",
        count()
    );
    // The expired key's row is gone from etcd, deleted by its shard's owner.
    let rows = |ns: &str| {
        let out = std::process::Command::new("etcdctl")
            .args([
                "--endpoints",
                &etcd.endpoint,
                "get",
                "--prefix",
                "--keys-only",
            ])
            .arg("kt-gcs/k")
            .env("ETCDCTL_API", "3")
            .output()
            .expect("etcdctl");
        let row = format!("kt-gcs/k{ns}\0");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines().filter(|l| l.starts_with(&row)).count()
    };
    assert!(
        test_support::eventually(Duration::from_secs(30), || rows(&brief_ns) == 0),
        "the expired key is still in etcd"
    );
    assert_eq!(rows(&kept_ns), 1);
    for r in &replicas {
        let got = dir.path().join(format!("got-{}", r.addr));
        let out = kt_with(
            &r.addr,
            &none,
            &[
                "get",
                "-n",
                &kept_ns,
                "kept",
                "--dest",
                got.to_str().unwrap(),
            ],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(std::fs::read(&got).unwrap() == std::fs::read(&kept).unwrap());
    }
}
