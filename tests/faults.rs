//! Failures injected at the seams, in-process: the store behind `StoreApi` failing a call
//! (`FaultyStore`), and a peer behind `Dial` dying mid-block or lying (`FaultyDial`), in front
//! of a real store server and real agents. What a put, a get and a mount's read do then, without
//! killing a process at the right instant (the tests that kill real processes are in
//! `peers.rs`, `swarm.rs` and `durability.rs`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::rig::Rig;
use ktfs::auth::Credential;
use ktfs::dataplane::faulty::{FaultyDial, Misbehave};
use ktfs::dataplane::peers::{Peers, Tcp};
use ktfs::fs::names::inode::ROOT;
use ktfs::key::{KeyPath, Namespace};
use ktfs::proto::{ListRequest, Locale, ResolveRequest, WindowSpec};
use ktfs::rpc::client::{connect_store, Store};
use ktfs::rpc::faulty::{FaultyStore, Injected};
use ktfs::rpc::status::Fault;
use ktfs::transfer::get::{self, GetOptions};
use ktfs::transfer::put::scan::ScanOptions;
use ktfs::transfer::put::{self, PutOptions};
use ktfs::transfer::remotes::Remotes;

const BLOCK: u32 = 65536;

/// A 1 MiB file of 16 blocks in the rig's store under `key`, and its bytes.
fn put_big(rig: &Rig, key: &str, seed: u64) -> Vec<u8> {
    let src = rig.dir.path().join(key);
    let data = common::pseudo_random(1 << 20, seed);
    std::fs::write(&src, &data).unwrap();
    rig.kt(&[
        "put",
        key,
        "--src",
        src.to_str().unwrap(),
        "--block-size",
        &BLOCK.to_string(),
    ]);
    data
}

/// Node `a`, on 127.0.0.2, holding `key` (fetched with `kt get`) and seeding it.
fn seeder(rig: &Rig, key: &str) -> common::AgentProc {
    let dir = rig.dir.path().join("a");
    let a = common::start_agent("127.0.0.2", &rig.server, &dir, "a");
    let got = dir.join("got");
    let fetched = common::kt_with(
        &rig.server,
        &a.socket,
        &["get", key, "--dest", got.to_str().unwrap()],
    );
    assert!(fetched.status.success(), "{fetched:?}");
    a
}

/// Peers over TCP, but every connection to 127.0.0.2 (node `a`) misbehaves as `how` says.
fn misbehaving_a(how: Misbehave) -> (Arc<FaultyDial>, Peers) {
    let dial = Arc::new(FaultyDial::new(Arc::new(Tcp)));
    dial.misbehave("127.0.0.2", how);
    (dial.clone(), Peers::over(dial))
}

fn dialled_a(dial: &FaultyDial) -> bool {
    dial.dialled().iter().any(|a| a.starts_with("127.0.0.2:"))
}

fn put_options(rig: &Rig, key: &str, src: &std::path::Path, remotes: Remotes) -> PutOptions {
    PutOptions {
        server: rig.server.clone(),
        credential: Credential::none(),
        namespace: Namespace::parse("default").unwrap(),
        key: KeyPath::parse(key).unwrap(),
        srcs: vec![src.to_str().unwrap().to_string()],
        scan: ScanOptions {
            block_size: BLOCK,
            ..Default::default()
        },
        locale: Locale::Store,
        force: false,
        ttl_secs: 0,
        agent_socket: rig.dir.path().join("no-agent.sock"),
        window: None,
        remotes,
    }
}

/// The store fails the publish that ends a put: the put fails with the store's fault, the key
/// is not there, and the blocks it uploaded are kept, so the retry sends none of them again.
#[test]
fn a_put_whose_publish_fails_leaves_no_key_and_its_retry_uploads_nothing() {
    let rig = Rig::new();
    let src = rig.dir.path().join("model.bin");
    let data = common::pseudo_random(3 << 20, 5);
    std::fs::write(&src, &data).unwrap();
    let pb = ktfs::transfer::progress_bar(false);
    rig.rt.block_on(async {
        let real = connect_store(&rig.server, &Credential::none())
            .await
            .unwrap();
        let faulty = Arc::new(FaultyStore::new(real.clone()));
        faulty.fail(Some("publish"), 1, Fault::Unavailable);
        let remotes = Remotes::new(Store::shared(faulty.clone()), Peers::default());

        let err = put::put(put_options(&rig, "model.bin", &src, remotes.clone()), &pb)
            .await
            .expect_err("the publish was failed");
        assert_eq!(err.fault(), Fault::Unavailable, "{err}");
        assert_eq!(faulty.calls(Some("publish")), 1);
        let resolved = real
            .resolve(ResolveRequest {
                namespace: "default".into(),
                key: "model.bin".into(),
                ..Default::default()
            })
            .await;
        assert!(
            resolved.as_ref().is_err_and(|e| e.is_not_found()),
            "{resolved:?}"
        );

        let report = put::put(put_options(&rig, "model.bin", &src, remotes), &pb)
            .await
            .unwrap();
        assert_eq!(report.bytes, data.len() as u64);
        assert_eq!(
            report.bytes_transferred, 0,
            "the first try's blocks were kept"
        );
        assert_eq!(faulty.calls(Some("publish")), 2);
    });
    let got = rig.dir.path().join("got.bin");
    rig.kt(&["get", "model.bin", "--dest", got.to_str().unwrap()]);
    assert!(std::fs::read(&got).unwrap() == data);
}

/// A store server whose listing pages do not go forward (each names as the next page the one
/// just asked for) fails the listing with an error, where its reader would ask forever.
#[test]
fn a_listing_whose_pages_do_not_go_forward_fails_rather_than_asking_forever() {
    let rig = Rig::new();
    let src = rig.dir.path().join("f");
    std::fs::write(&src, b"one").unwrap();
    rig.kt(&["put", "dir/f", "--src", src.to_str().unwrap()]);
    rig.rt.block_on(async {
        let real = connect_store(&rig.server, &Credential::none())
            .await
            .unwrap();
        let faulty = Arc::new(FaultyStore::new(real));
        faulty.inject(Some("list"), 1, Injected::NoProgress);
        let store = Store::shared(faulty.clone());
        let listing = store.list_all(ListRequest {
            namespace: "default".into(),
            prefix: "dir".into(),
            ..Default::default()
        });
        let err = tokio::time::timeout(Duration::from_secs(30), listing)
            .await
            .expect("the listing never ended")
            .expect_err("a listing that does not go forward");
        assert!(err.to_string().contains("does not go past"), "{err}");
        assert_eq!(faulty.calls(Some("list")), 2);
    });
}

/// A mount reads a file whose blocks node `a` holds; every connection to `a` ends partway into
/// the first block it sends. The read gets every byte right, from the store.
#[test]
fn a_mount_read_from_a_peer_that_dies_mid_block_is_finished_by_the_store() {
    let rig = Rig::new();
    let data = put_big(&rig, "big.bin", 7);
    let _a = seeder(&rig, "big.bin");
    let (dial, peers) = misbehaving_a(Misbehave::DieAfter(u64::from(BLOCK) / 2));
    let core = rig.core_through(Remotes { store: None, peers });

    let ino = core.lookup(ROOT, "big.bin").unwrap().ino;
    let (fh, _) = core.open(ino, libc::O_RDONLY).unwrap();
    let file = core.read_file(fh).unwrap();
    let member = file
        .membership()
        .expect("a multi-block reader joins the window");
    let mut out = Vec::new();
    core.read_on(ino, fh, &mut out, data.len(), 1 << 20);
    assert!(out == data, "the bytes read differ");
    assert!(dialled_a(&dial), "a was never asked: {:?}", dial.dialled());
    let parents = || rig.rt.block_on(member.report()).parents;
    assert!(
        common::eventually(Duration::from_secs(5), || parents()
            .iter()
            .any(|p| p == "store")),
        "{:?}",
        parents()
    );
    core.release(fh).unwrap();
}

/// `kt get` of a file whose blocks node `a` holds; `a` flips a byte of the first block it
/// sends on each connection. The lie is caught by the block's hash and the file is right.
#[test]
fn a_get_from_a_lying_peer_refuses_its_block_and_gets_it_elsewhere() {
    let rig = Rig::new();
    let data = put_big(&rig, "lie.bin", 13);
    let _a = seeder(&rig, "lie.bin");
    // Past the frame's header, into the block's bytes.
    let (dial, peers) = misbehaving_a(Misbehave::Lie(4096));
    let dest = rig.dir.path().join("fetched.bin");
    let report = rig
        .rt
        .block_on(get::get(
            GetOptions {
                server: rig.server.clone(),
                credential: Credential::none(),
                namespace: Namespace::parse("default").unwrap(),
                key: KeyPath::parse("lie.bin").unwrap(),
                dest: dest.to_str().unwrap().to_string(),
                contents: false,
                force: false,
                excludes: vec![],
                includes: vec![],
                seed: false,
                agent_socket: rig.dir.path().join("no-agent.sock"),
                window: WindowSpec::default(),
                bwlimit: None,
                store_only: false,
                preserve: Default::default(),
                remotes: Remotes { store: None, peers },
            },
            &ktfs::transfer::progress_bar(false),
        ))
        .unwrap();
    assert!(
        std::fs::read(&dest).unwrap() == data,
        "the file got differs"
    );
    assert!(dialled_a(&dial), "a was never asked: {:?}", dial.dialled());
    let from_store: u64 = report
        .sources
        .iter()
        .filter(|s| s.source == "store")
        .map(|s| s.bytes)
        .sum();
    assert!(from_store > 0, "{:?}", report.sources);
    assert_eq!(
        report.sources.iter().map(|s| s.bytes).sum::<u64>(),
        data.len() as u64,
        "a lied block counted as received: {:?}",
        report.sources
    );
}
