//! Peers: in-place (`locale=local`) publishing, seeding, nearest-source order, and sources that
//! lie or die.

mod common;

use std::collections::HashMap;
use std::fs;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use ktfs::hash::BlockHash;
use ktfs::proto::{AddLocationRequest, HeartbeatRequest, NodeInfo, RegisterNodeRequest};

const MIB: usize = 1 << 20;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn no_partial_files(dir: &std::path::Path) {
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(
                !name.contains("ktpart"),
                "half-written file left behind: {name}"
            );
        }
    }
}

#[test]
fn local_locale_is_served_in_place_and_getters_seed() {
    let c = Cluster::new("127.0.0.21");
    let a = c.agent("127.0.0.22", "node-a");
    let b = c.agent("127.0.0.23", "node-b");
    let cc = c.agent("127.0.0.24", "node-c");
    let f = c.path("weights.bin");
    let data = pseudo_random(10 * MIB + 123, 3);
    fs::write(&f, &data).unwrap();
    let fs_ = f.to_str().unwrap();

    // Without an agent, local publishing is refused with a reason.
    let out = c.kt(None, &["put", "w", "--src", fs_, "--locale", "local"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent"));

    let put = c.json(
        Some(&a),
        &[
            "put",
            "w",
            "--src",
            fs_,
            "--locale",
            "local",
            "--block-size",
            "1048576",
        ],
    );
    assert_eq!(
        put["bytes_transferred"], 0,
        "local publishing must not copy"
    );
    let ls = c.json(None, &["ls"]);
    assert_eq!(ls[0]["name"], "w");
    assert_eq!(ls[0]["locale"], "node-a");

    // B fetches from A's files in place, and becomes a source.
    let db = c.path("b.bin");
    let got = c.json(Some(&b), &["get", "w", "--dest", db.to_str().unwrap()]);
    assert!(fs::read(&db).unwrap() == data);
    assert_eq!(listed_sources(&got), ["node-a"]);
    assert_eq!(got["seeded"], true);

    // C prefers the seeding peer B over the origin A.
    let dc = c.path("c.bin");
    let got = c.json(
        Some(&cc),
        &["get", "w", "--dest", dc.to_str().unwrap(), "--no-seed-data"],
    );
    assert!(fs::read(&dc).unwrap() == data);
    assert_eq!(listed_sources(&got), ["node-b"]);
    assert_eq!(got["seeded"], false);

    // The published file changes on A and B dies: nobody may serve the old blocks' bytes, so the
    // get fails cleanly instead of writing the wrong data.
    let mut changed = data.clone();
    changed[5 * MIB] ^= 0xff;
    fs::write(&f, &changed).unwrap();
    drop(b);
    let dd = c.path("d-dest");
    fs::create_dir_all(&dd).unwrap();
    let out = c.kt(
        None,
        &["get", "w", "--dest", dd.join("d.bin").to_str().unwrap()],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("could not fetch"), "{err}");
    assert!(!dd.join("d.bin").exists());
    no_partial_files(&dd);
}

/// What a fake peer answers to a GET, or `None` to die (close every connection, accept no more).
type Answer = dyn Fn(&BlockHash) -> Option<Vec<u8>> + Send + Sync;

/// Serves the data-plane protocol by hand, so a test decides exactly what a peer does wrong,
/// and registers it with the store as a node holding `version`.
fn fake_peer(server: &str, ip: &str, node: &str, version_hex: &str, answer: Arc<Answer>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind(format!("{ip}:0")).unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let dead = Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            if dead.load(Ordering::SeqCst) {
                break;
            }
            let Ok(mut s) = conn else { break };
            let (answer, dead) = (answer.clone(), dead.clone());
            std::thread::spawn(move || {
                let mut hello = [0u8; 5];
                if s.read_exact(&mut hello).is_err() {
                    return;
                }
                loop {
                    let mut head = [0u8; 5];
                    if s.read_exact(&mut head).is_err() {
                        return;
                    }
                    let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
                    let mut payload = vec![0u8; len];
                    if s.read_exact(&mut payload).is_err() {
                        return;
                    }
                    let hash = BlockHash::from_slice(&payload[..32]).unwrap();
                    let Some(data) = answer(&hash) else {
                        dead.store(true, Ordering::SeqCst);
                        let _ = s.shutdown(std::net::Shutdown::Both);
                        return;
                    };
                    let mut frame = vec![0x81];
                    frame.extend_from_slice(&((32 + data.len()) as u32).to_be_bytes());
                    frame.extend_from_slice(hash.as_bytes());
                    frame.extend_from_slice(&data);
                    if s.write_all(&frame).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(async {
        let store = ktfs::rpc::client::connect_store(server, &ktfs::auth::Credential::none())
            .await
            .unwrap();
        store
            .register_node(RegisterNodeRequest {
                node: Some(NodeInfo {
                    node_id: node.into(),
                    data_addr: addr,
                    zone: String::new(),
                }),
            })
            .await
            .unwrap();
        store
            .add_location(AddLocationRequest {
                version: unhex(version_hex),
                node_id: node.into(),
                ..Default::default()
            })
            .await
            .unwrap();
        store
    });
    // Keep the fake node's lease alive as a real agent would, however slow the machine is
    // (bounded: a test ends long before).
    let node = node.to_string();
    std::thread::spawn(move || {
        for _ in 0..600 {
            std::thread::sleep(std::time::Duration::from_millis(500));
            let hb = HeartbeatRequest {
                node_id: node.clone(),
                ..Default::default()
            };
            if rt.block_on(store.heartbeat(hb)).is_err() {
                break;
            }
        }
    });
}

/// Serves the real blocks of `data` for `budget` requests, then dies.
fn dying(data: &[u8], budget: usize) -> Arc<Answer> {
    let blocks: HashMap<BlockHash, Vec<u8>> = data
        .chunks(MIB)
        .map(|b| (BlockHash::of(b), b.to_vec()))
        .collect();
    let left = AtomicUsize::new(budget);
    Arc::new(move |h| {
        left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| b.checked_sub(1))
            .ok()?;
        blocks.get(h).cloned()
    })
}

#[test]
fn corrupt_peer_is_detected_and_store_refetched() {
    let c = Cluster::new("127.0.0.31");
    let f = c.path("data.bin");
    let data = pseudo_random(8 * MIB, 11);
    fs::write(&f, &data).unwrap();
    let put = c.json(
        None,
        &[
            "put",
            "d",
            "--src",
            f.to_str().unwrap(),
            "--block-size",
            "1048576",
        ],
    );
    let version = put["version"].as_str().unwrap().to_string();
    // A peer that serves wrong bytes of the right length.
    fake_peer(
        &c.server.addr,
        "127.0.0.32",
        "liar",
        &version,
        Arc::new(|_: &BlockHash| Some(vec![0u8; MIB])),
    );

    let dest = c.path("got.bin");
    let dest_s = dest.to_str().unwrap().to_string();
    let got = c.json(None, &["get", "d", "--dest", &dest_s]);
    assert!(
        fs::read(&dest).unwrap() == data,
        "corrupt bytes reached the destination"
    );
    // The liar was asked first (peers before the store) and gave nothing that was kept.
    assert_eq!(listed_sources(&got), ["store"]);
    assert_eq!(got["bytes_transferred"], 8 * MIB as u64);
}

#[test]
fn source_dying_mid_transfer_resumes_from_store() {
    let c = Cluster::new("127.0.0.41");
    let f = c.path("data.bin");
    let data = pseudo_random(16 * MIB, 12);
    fs::write(&f, &data).unwrap();
    let put = c.json(
        None,
        &[
            "put",
            "d",
            "--src",
            f.to_str().unwrap(),
            "--block-size",
            "1048576",
        ],
    );
    let version = put["version"].as_str().unwrap().to_string();
    fake_peer(
        &c.server.addr,
        "127.0.0.42",
        "dying",
        &version,
        dying(&data, 5),
    );

    let dest = c.path("got.bin");
    let dest_s = dest.to_str().unwrap().to_string();
    let got = c.json(None, &["get", "d", "--dest", &dest_s]);
    assert!(fs::read(&dest).unwrap() == data);
    // The peer was tried first, died, and the store gave the rest. What the peer sent just
    // before it died may be lost with its connection (a reset discards unread data), so it
    // may have given nothing that was kept; never more than it served.
    assert_eq!(
        got["broadcast"][0]["parents"],
        serde_json::json!(["dying", "store"]),
        "{got}"
    );
    assert!(bytes_from(&got, "dying") <= 5 * MIB as u64, "{got}");
    assert_eq!(
        bytes_from(&got, "dying") + bytes_from(&got, "store"),
        16 * MIB as u64,
        "{got}"
    );
    assert!(
        listed_sources(&got)
            .iter()
            .all(|s| s == "dying" || s == "store"),
        "{got}"
    );
}

#[test]
fn only_source_dying_fails_cleanly() {
    let c = Cluster::new("127.0.0.51");
    let a = c.agent("127.0.0.52", "origin");
    let f = c.path("data.bin");
    let data = pseudo_random(16 * MIB, 13);
    fs::write(&f, &data).unwrap();
    let put = c.json(
        Some(&a),
        &[
            "put",
            "d",
            "--src",
            f.to_str().unwrap(),
            "--block-size",
            "1048576",
            "--locale",
            "local",
        ],
    );
    // The origin's agent dies; a stand-in that dies after a few blocks is the only source left.
    drop(a);
    let version = put["version"].as_str().unwrap().to_string();
    fake_peer(
        &c.server.addr,
        "127.0.0.53",
        "dying",
        &version,
        dying(&data, 4),
    );

    let dest_dir = c.path("dest");
    fs::create_dir_all(&dest_dir).unwrap();
    let dest = dest_dir.join("got.bin");
    let dest_s = dest.to_str().unwrap().to_string();
    let out = c.kt(None, &["get", "d", "--dest", &dest_s]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("could not fetch"), "{err}");
    assert!(!dest.exists(), "a half-written destination was left");
    no_partial_files(&dest_dir);
}

#[test]
fn killed_agent_restarts_with_its_publications() {
    let c = Cluster::new("127.0.0.61");
    let a = c.agent("127.0.0.62", "node-a");
    let f = c.path("w.bin");
    let data = pseudo_random(6 * MIB, 21);
    fs::write(&f, &data).unwrap();
    c.ok(
        Some(&a),
        &[
            "put",
            "w",
            "--src",
            f.to_str().unwrap(),
            "--locale",
            "local",
        ],
    );
    // SIGKILL: no clean shutdown, no flush.
    drop(a);
    let a = c.agent("127.0.0.62", "node-a");
    let dest = c.path("got.bin");
    let got = c.json(None, &["get", "w", "--dest", dest.to_str().unwrap()]);
    assert_eq!(listed_sources(&got), ["node-a"]);
    assert!(fs::read(&dest).unwrap() == data);
    drop(a);
}

/// The node ids the store server names as sources of `key`'s version.
fn sources_of(server: &str, key: &str) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = ktfs::rpc::client::connect_store(server, &ktfs::auth::Credential::none())
            .await
            .unwrap();
        let r = store
            .resolve(ktfs::proto::ResolveRequest {
                namespace: "default".into(),
                key: key.into(),
                ..Default::default()
            })
            .await
            .unwrap();
        r.sources
            .into_iter()
            .map(|s| s.node_id)
            .filter(|n| !n.is_empty())
            .collect()
    })
}

/// A getter's copy seeds the version from its node; once the copy is removed (or changed),
/// the node's next heartbeats tell the store server, which stops naming the node as a source,
/// so later getters are not sent to a node that no longer has it.
#[test]
fn a_node_whose_seeded_copy_is_removed_is_no_longer_a_source() {
    let c = Cluster::new("127.0.0.33");
    let (data, _) = c.publish_random("s", 2 * MIB, 33, "1048576");
    let a = c.agent("127.0.0.34", "node-0");
    let b = c.agent("127.0.0.35", "node-1");
    let d0 = c.path("d0");
    let d1 = c.path("d1");
    for (agent, d) in [(&a, &d0), (&b, &d1)] {
        let got = c.json(Some(agent), &["get", "s", "-d", d.to_str().unwrap()]);
        assert_eq!(got["seeded"], true, "{got}");
    }
    let mut both = sources_of(&c.server.addr, "s");
    both.sort();
    assert_eq!(both, ["node-0", "node-1"]);
    fs::remove_file(&d0).unwrap();
    // node-1's copy changes in place: it holds the version no more either.
    let mut changed = data.clone();
    changed[10] ^= 1;
    fs::write(&d1, &changed).unwrap();
    assert!(
        eventually(std::time::Duration::from_secs(10), || sources_of(
            &c.server.addr,
            "s"
        )
        .is_empty()),
        "still named: {:?}",
        sources_of(&c.server.addr, "s")
    );
    // A later get lands it from the store, and its node seeds it again.
    let again = c.path("again");
    let got = c.json(Some(&a), &["get", "s", "-d", again.to_str().unwrap()]);
    assert!(fs::read(&again).unwrap() == data, "{got}");
    assert_eq!(sources_of(&c.server.addr, "s"), ["node-0"]);
}

/// An agent refuses a socket directory another user made (a `/tmp/ktfs` made first by someone
/// who could then swap the socket for their own), and one others may write to; it takes its
/// own.
#[test]
fn an_agent_refuses_a_socket_directory_another_user_could_swap_its_socket_in() {
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::new("127.0.0.35");
    let start = |sockdir: &std::path::Path| {
        std::process::Command::new(kt_bin())
            .args([
                "agent",
                "--server",
                &c.server.addr,
                "--listen",
                "127.0.0.35:0",
            ])
            .arg("--cache-dir")
            .arg(c.path("cache"))
            .arg("--socket")
            .arg(sockdir.join("agent.sock"))
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let theirs = c.path("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(1234), Some(1234)).unwrap();
    let out = start(&theirs);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("owned by uid 1234"), "{err}");
    assert!(!theirs.join("agent.sock").exists());

    let open = c.path("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = String::from_utf8_lossy(&start(&open).stderr).into_owned();
    assert!(err.contains("others may write to it"), "{err}");

    // Its own directory, made for it, is taken.
    let a = start_agent("127.0.0.35", &c.server.addr, &c.path("mine"), "n35");
    assert!(a.socket.exists());
}

/// The manifest of one file of one block, `data`.
fn one_block(data: &[u8]) -> ktfs::proto::Manifest {
    use ktfs::proto::{BlockRef, EntryKind, FileEntry, Manifest};
    Manifest {
        block_size: 4 << 20,
        entries: vec![FileEntry {
            kind: EntryKind::File as i32,
            size: data.len() as u64,
            blocks: vec![BlockRef {
                hash: blake3::hash(data).as_bytes().to_vec(),
                len: data.len() as u32,
            }],
            mode: 0o644,
            ..Default::default()
        }],
    }
}

/// A publish in place of `manifest`'s one file, at `path`, as `key` of namespace default.
fn local_publish(
    manifest: &ktfs::proto::Manifest,
    key: &str,
    path: &std::path::Path,
) -> ktfs::proto::PublishLocalRequest {
    use ktfs::proto::{LocalFile, PublishLocalRequest, PublishRequest};
    PublishLocalRequest {
        publish: Some(PublishRequest {
            namespace: "default".into(),
            key: key.into(),
            manifest: Some(manifest.clone()),
            ..Default::default()
        }),
        files: vec![LocalFile {
            entry_path: String::new(),
            disk_path: path.display().to_string(),
        }],
    }
}

/// A caller on an agent's socket acts with its own rights (issue 42, item 2): the agent, root,
/// opens the files a caller names as that caller, so a user who cannot read a file cannot have
/// the agent publish, seed or offer it (it once read `/etc/shadow` back a byte at a time this
/// way); a FIFO is refused at once instead of holding the agent; and only root mounts and
/// unmounts. The socket is open to every user of the node.
#[test]
fn an_agent_opens_what_its_callers_name_with_their_rights_only() {
    use ktfs::proto::{LocalFile, MountRequest, ReceiveEvent};
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::new("127.0.0.39");
    let node_dir = c.path("n1");
    fs::create_dir_all(&node_dir).unwrap();
    let agent = start_agent("127.0.0.46", &c.server.addr, &node_dir, "n1");
    // Every user of the node may call; what a call may do is the caller's to prove.
    let mode = fs::metadata(&agent.socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o666);
    let files = c.path("files");
    fs::create_dir_all(&files).unwrap();
    for d in [c.dir.path(), files.as_path()] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let data = pseudo_random(8192, 46);
    let (secret, readable, fifo) = (
        files.join("secret"),
        files.join("readable"),
        files.join("fifo"),
    );
    for (path, mode) in [(&secret, 0o600), (&readable, 0o644)] {
        fs::write(path, &data).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }
    let fifo_c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo_c.as_ptr(), 0o666) }, 0);
    let manifest = one_block(&data);
    let manifest_p = manifest.clone();
    let publish = move |key: &str, path: &std::path::Path| local_publish(&manifest_p, key, path);
    let sock = agent.socket.clone();
    let (secret_p, readable_p, fifo_p) = (secret.clone(), readable.clone(), fifo.clone());
    let manifest_r = manifest.clone();
    let answers = as_user(65534, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut agent = ktfs::rpc::client::connect_agent(&sock).await.unwrap();
            let mut say = Vec::new();
            for (key, path) in [("s", &secret_p), ("f", &fifo_p), ("r", &readable_p)] {
                let got = agent.publish_local(publish(key, path)).await;
                say.push(
                    got.map(|_| "published".to_string())
                        .map_err(|e| e.message().to_string()),
                );
            }
            let offer = ReceiveEvent {
                manifest: Some(manifest_r),
                files: vec![LocalFile {
                    entry_path: String::new(),
                    disk_path: secret_p.display().to_string(),
                }],
                ..Default::default()
            };
            let got = agent.receive(tokio_stream::iter([offer])).await;
            say.push(
                got.map(|_| "offered".to_string())
                    .map_err(|e| e.message().to_string()),
            );
            let got = agent
                .mount(MountRequest {
                    mountpoint: "/tmp/anywhere".into(),
                    namespace: "default".into(),
                    ..Default::default()
                })
                .await;
            say.push(
                got.map(|_| "mounted".to_string())
                    .map_err(|e| e.message().to_string()),
            );
            say
        })
    });
    let err = |i: usize| answers[i].clone().unwrap_err();
    assert!(err(0).contains("Permission denied"), "{answers:?}");
    assert!(err(1).contains("not a regular file"), "{answers:?}");
    assert_eq!(answers[2].as_deref(), Ok("published"), "{answers:?}");
    assert!(err(3).contains("Permission denied"), "{answers:?}");
    assert!(err(4).contains("only root may"), "{answers:?}");
    // What nobody could read was not registered: the key it could publish is served, and the
    // secret's bytes only from the file nobody could read, which is not among the places.
    let got = c.path("got");
    let out = kt_with(
        &c.server.addr,
        &agent.socket,
        &["get", "r", "--dest", got.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::read(&got).unwrap(), data);
}

/// The groups a caller's files are opened with are those it connected with (SO_PEERGROUPS), not
/// what `/proc` says of its process's leader now: a thread of another identity, a connection
/// handed on or a pid reused would otherwise lend the caller someone else's groups (issue 42).
/// Here the caller is a thread of uid 65534 in group 4242 of this test's process, whose leader
/// is in neither group: a file of group 4242 opens, one of group 4343 does not.
#[test]
fn a_caller_on_an_agents_socket_opens_files_with_the_groups_it_connected_with() {
    use std::os::unix::fs::{chown, PermissionsExt};
    let c = Cluster::new("127.0.0.216");
    let node_dir = c.path("n1");
    fs::create_dir_all(&node_dir).unwrap();
    let agent = start_agent("127.0.0.217", &c.server.addr, &node_dir, "n1");
    let files = c.path("files");
    fs::create_dir_all(&files).unwrap();
    for d in [c.dir.path(), files.as_path()] {
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let data = pseudo_random(8192, 216);
    let (ours, theirs) = (files.join("ours"), files.join("theirs"));
    for (path, group) in [(&ours, 4242), (&theirs, 4343)] {
        fs::write(path, &data).unwrap();
        chown(path, Some(0), Some(group)).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o640)).unwrap();
    }
    let manifest = one_block(&data);
    let publish = move |key: &str, path: &std::path::Path| local_publish(&manifest, key, path);
    let sock = agent.socket.clone();
    let answers = std::thread::spawn(move || {
        // SAFETY: raw setgroups/setresgid/setresuid(2) of this thread alone, which ends after.
        unsafe {
            let groups = [4242u32];
            assert_eq!(libc::syscall(libc::SYS_setgroups, 1, groups.as_ptr()), 0);
            assert_eq!(libc::syscall(libc::SYS_setresgid, 65534, 65534, 65534), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534), 0);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut agent = ktfs::rpc::client::connect_agent(&sock).await.unwrap();
            let mut say = Vec::new();
            for (key, path) in [("ours", &ours), ("theirs", &theirs)] {
                let got = agent.publish_local(publish(key, path)).await;
                say.push(
                    got.map(|_| "published".to_string())
                        .map_err(|e| e.message().to_string()),
                );
            }
            say
        })
    })
    .join()
    .unwrap();
    let leader = fs::read_to_string("/proc/self/status").unwrap();
    let groups = leader.lines().find(|l| l.starts_with("Groups:")).unwrap();
    assert!(
        !groups.contains("4242") && !groups.contains("4343"),
        "{groups}"
    );
    assert_eq!(answers[0].as_deref(), Ok("published"), "{answers:?}");
    assert!(
        answers[1]
            .as_ref()
            .unwrap_err()
            .contains("Permission denied"),
        "{answers:?}"
    );
}
