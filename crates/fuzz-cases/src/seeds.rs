//! Small, valid inputs for each target, from which the fuzzer mutates: real frames, a real
//! encoded manifest, real ioctl structs, a real sequence of calls. `fuzz/seeds/<target>/` holds
//! them as files (written by `KT_WRITE_SEEDS=1 cargo test -p fuzz-cases`), and the
//! regression test checks that the files are still these.

use prost::Message;

use ktfs::gpu::abi::{ABI_VERSION, BUF_HOST_SHM};
use ktfs::hash::BlockHash;
use ktfs::manifest::{BlockRef, EntryKind, FileEntry, Manifest};
use ktfs::proto::*;

fn frame(op: u8, head: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = vec![op];
    out.extend_from_slice(&((head.len() + body.len()) as u32).to_be_bytes());
    out.extend_from_slice(head);
    out.extend_from_slice(body);
    out
}

fn block(data: &[u8]) -> BlockRef {
    BlockRef {
        hash: BlockHash::of(data).0.to_vec(),
        len: data.len() as u32,
    }
}

fn entry(path: &str, kind: EntryKind, blocks: &[&[u8]]) -> FileEntry {
    FileEntry {
        path: path.into(),
        kind: kind as i32,
        mode: if kind == EntryKind::Directory {
            0o755
        } else {
            0o644
        },
        size: blocks.iter().map(|b| b.len() as u64).sum(),
        blocks: blocks.iter().map(|b| block(b)).collect(),
        mtime_sec: 1_700_000_000,
        ..Default::default()
    }
}

/// A directory: a file, a subdirectory with a file of two blocks, a symlink.
pub fn directory_manifest() -> Manifest {
    let mut link = entry("l", EntryKind::Symlink, &[]);
    link.symlink_target = "a".into();
    Manifest {
        block_size: 4,
        entries: vec![
            entry("", EntryKind::Directory, &[]),
            entry("a", EntryKind::File, &[b"x"]),
            entry("d", EntryKind::Directory, &[]),
            entry("d/b", EntryKind::File, &[b"abcd", b"ef"]),
            link,
        ],
    }
}

/// One file of one block.
pub fn file_manifest(data: &[u8]) -> Manifest {
    Manifest {
        block_size: 4 << 20,
        entries: vec![entry("", EntryKind::File, &[data])],
    }
}

fn call(rpc: u8, req: &impl Message) -> Vec<u8> {
    let body = req.encode_to_vec();
    let mut out = vec![rpc];
    out.extend_from_slice(&(body.len() as u16).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn ioctl(pick: u8, fields: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![pick];
    for f in fields {
        out.extend_from_slice(f);
    }
    out
}

fn padded<const N: usize>(text: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out[..text.len()].copy_from_slice(text);
    out
}

/// Every seed: its target, its file name, its bytes.
pub fn seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let x = BlockHash::of(b"x");
    let zero = [0u8; 32];
    let mut out = vec![
        (
            "data_plane_server",
            "put-get",
            [
                frame(3, b"a ticket the open gate ignores", &[]),
                frame(2, x.as_bytes(), b"x"),
                frame(1, x.as_bytes(), &[]),
                frame(1, BlockHash::of(b"y").as_bytes(), &[]),
                frame(2, x.as_bytes(), b"not x"),
            ]
            .concat(),
        ),
        ("data_plane_server", "get-now-get-delta", {
            let block: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
            let h = BlockHash::of(&block);
            let mut older = block.clone();
            older[10_000] ^= 1;
            [
                frame(2, h.as_bytes(), &block),
                frame(8, h.as_bytes(), &[]),
                frame(8, BlockHash::of(b"y").as_bytes(), &[]),
                frame(7, h.as_bytes(), &ktfs::dataplane::delta::signature(&older)),
                frame(7, h.as_bytes(), b"no signature"),
                frame(7, BlockHash::of(b"y").as_bytes(), b"no signature"),
            ]
            .concat()
        }),
        (
            "data_plane_client",
            "delta",
            frame(0x88, x.as_bytes(), b"a delta's bytes"),
        ),
        (
            "data_plane_client",
            "answers",
            [
                frame(0x81, x.as_bytes(), b"x"),
                frame(0x82, x.as_bytes(), &[]),
                frame(0x83, x.as_bytes(), &[]),
                frame(0x84, &zero, b"not allowed"),
                frame(0x85, &zero, b"disk full"),
            ]
            .concat(),
        ),
        (
            "manifest",
            "directory",
            directory_manifest().encode_to_vec(),
        ),
        ("manifest", "file", file_manifest(b"hello").encode_to_vec()),
        (
            "keys",
            "key-and-path",
            b"my-svc/models/v1\nconfig/a.json".to_vec(),
        ),
        ("keys", "namespace", b"/team-a/\ndefault".to_vec()),
    ];
    let v = ABI_VERSION.to_le_bytes();
    let mut buffer = Vec::new();
    let fields: [&[u8]; 7] = [
        &BUF_HOST_SHM.to_le_bytes()[..],
        &0i32.to_le_bytes(),
        &0u32.to_le_bytes(),
        &0u32.to_le_bytes(),
        &0u64.to_le_bytes(),
        &4096u64.to_le_bytes(),
        &padded::<64>(b"/ktfs-shm-0"),
    ];
    for f in fields {
        buffer.extend_from_slice(f);
    }
    let buffers: [&[u8]; 6] = [
        &v[..],
        &0u32.to_le_bytes(),
        &1u32.to_le_bytes(),
        &0u32.to_le_bytes(),
        &buffer,
        &vec![0u8; 127 * 96],
    ];
    out.push(("gpu_ioctl", "put", ioctl(0x80, &buffers)));
    out.push(("gpu_ioctl", "get", ioctl(0x81, &buffers)));
    out.push((
        "gpu_ioctl",
        "join",
        ioctl(
            0x82,
            &[
                &v,
                &2u32.to_le_bytes(),
                &30_000u64.to_le_bytes(),
                &2u32.to_le_bytes(),
                &0u32.to_le_bytes(),
                &padded::<128>(b"team-a/weights"),
                &padded::<1024>(b"127.0.0.1,127.0.0.2"),
            ],
        ),
    ));
    out.push((
        "gpu_ioctl",
        "status",
        ioctl(0x83, &[&7u64.to_le_bytes(), &[0u8; 280]]),
    ));
    let m = file_manifest(b"hello");
    let version = ktfs::manifest::version_of(&m).0.to_vec();
    let publish = PublishRequest {
        namespace: "team-a".into(),
        key: "seed/a".into(),
        manifest: Some(m),
        inline_blocks: vec![InlineBlock {
            hash: BlockHash::of(b"hello").0.to_vec(),
            data: b"hello".to_vec(),
        }],
        force: true,
        ..Default::default()
    };
    let node = RegisterNodeRequest {
        node: Some(NodeInfo {
            node_id: "n1".into(),
            data_addr: "127.0.0.243:7448".into(),
            zone: "z".into(),
        }),
    };
    let dir = PublishRequest {
        namespace: "team-a".into(),
        key: "seed/dir".into(),
        manifest: Some(directory_manifest()),
        inline_blocks: [&b"x"[..], b"abcd", b"ef"]
            .iter()
            .map(|d| InlineBlock {
                hash: BlockHash::of(d).0.to_vec(),
                data: d.to_vec(),
            })
            .collect(),
        ttl_secs: 3600,
        force: true,
        ..Default::default()
    };
    let ns = |key: &str| ("team-a".to_string(), key.to_string());
    let (n, k) = ns("seed/a");
    out.push((
        "grpc_handlers",
        "publish-resolve-rename-remove",
        [
            call(0, &node),
            call(3, &publish),
            call(
                5,
                &ResolveRequest {
                    watcher: 0,
                    namespace: n.clone(),
                    key: k.clone(),
                    inline_up_to: 1024,
                },
            ),
            call(
                6,
                &ListRequest {
                    namespace: n.clone(),
                    prefix: "seed".into(),
                    recursive: true,
                    ..Default::default()
                },
            ),
            call(
                8,
                &AddLocationRequest {
                    version: version.clone(),
                    node_id: "n1".into(),
                },
            ),
            call(
                10,
                &LinkRequest {
                    namespace: n.clone(),
                    from: k.clone(),
                    to: "seed/link".into(),
                    ..Default::default()
                },
            ),
            call(
                9,
                &RenameRequest {
                    namespace: n.clone(),
                    from: k.clone(),
                    to: "seed/b".into(),
                    no_replace: false,
                    ..Default::default()
                },
            ),
            call(
                11,
                &SetAttrRequest {
                    namespace: n.clone(),
                    key: "seed/b".into(),
                    mode: Some(0o600),
                    ..Default::default()
                },
            ),
            call(
                7,
                &RemoveRequest {
                    namespace: n.clone(),
                    key: "seed".into(),
                    prefix: true,
                    ..Default::default()
                },
            ),
        ]
        .concat(),
    ));
    // A batch: two good items, one below a file (refused alone), one key twice.
    let item = |key: &str| PublishRequest {
        key: key.into(),
        ..publish.clone()
    };
    // One PublishBatch of `keys` in team-a.
    let batch = |keys: &[&str]| {
        call(
            19,
            &PublishBatchRequest {
                namespace: "team-a".into(),
                items: keys.iter().map(|k| item(k)).collect(),
                watcher: 0,
            },
        )
    };
    out.push((
        "grpc_handlers",
        "publish-batch",
        [
            call(0, &node),
            batch(&["batch/a", "batch/a/below", "batch/b", "batch/a"]),
        ]
        .concat(),
    ));
    // Many keys at once: two published, one missing, one malformed.
    out.push((
        "grpc_handlers",
        "resolve-many",
        [
            call(0, &node),
            batch(&["many/a", "many/b"]),
            call(
                21,
                &ResolveManyRequest {
                    watcher: 0,
                    namespace: "team-a".into(),
                    keys: vec![
                        "many/a".into(),
                        "many/none".into(),
                        "many//bad".into(),
                        "many/b".into(),
                    ],
                    inline_up_to: 65536,
                },
            ),
        ]
        .concat(),
    ));
    // A watch that acknowledges every change, renewed once, then a publish it is told of; and
    // one that acknowledges nothing, whose lease the next publish waits out.
    for (name, renew) in [("watch-acked", 2), ("watch-silent", 1)] {
        out.push((
            "grpc_handlers",
            name,
            [
                call(0, &node),
                call(
                    22,
                    &WatchUp {
                        namespace: "team-a".into(),
                        acked: 0,
                        renew,
                    },
                ),
                call(
                    22,
                    &WatchUp {
                        renew: renew + 2,
                        ..Default::default()
                    },
                ),
                call(3, &item("watched/a")),
            ]
            .concat(),
        ));
    }
    // A listing with those a walk reads next: a tree two levels deep, listed from inside it.
    out.push((
        "grpc_handlers",
        "list-ahead",
        [
            call(0, &node),
            batch(&["walk/a/1", "walk/b/x/1", "walk/b/y/1", "walk/c/1"]),
            call(
                6,
                &ListRequest {
                    namespace: "team-a".into(),
                    prefix: "walk/b".into(),
                    ahead: 64,
                    ..Default::default()
                },
            ),
        ]
        .concat(),
    ));
    out.push((
        "grpc_handlers",
        "directory-and-broadcast",
        [
            call(0, &node),
            call(
                1,
                &HeartbeatRequest {
                    node_id: "n1".into(),
                    ..Default::default()
                },
            ),
            call(
                2,
                &MissingBlocksRequest {
                    hashes: vec![x.0.to_vec(), vec![1; 32]],
                },
            ),
            call(3, &dir),
            call(
                12,
                &JoinRequest {
                    namespace: n.clone(),
                    key: "seed/dir".into(),
                    version: ktfs::manifest::version_of(&directory_manifest()).0.to_vec(),
                    window: Some(WindowSpec {
                        world_size: 2,
                        timeout_ms: 1000,
                        ..Default::default()
                    }),
                    node_id: "n1".into(),
                    serves: true,
                    ..Default::default()
                },
            ),
            call(
                15,
                &GetWindowRequest {
                    group_id: "team-a/seed".into(),
                },
            ),
            call(
                16,
                &GpuJoinRequest {
                    namespace: n.clone(),
                    key: "seed/gpu".into(),
                    window: Some(WindowSpec {
                        world_size: 2,
                        ..Default::default()
                    }),
                    node_id: "n1".into(),
                    worker_addr: "127.0.0.243:9000".into(),
                    registration: 1,
                    ..Default::default()
                },
            ),
            call(
                17,
                &GpuAwaitRequest {
                    group_id: "team-a/seed/gpu".into(),
                    wait_ms: 1,
                    ..Default::default()
                },
            ),
            call(
                7,
                &RemoveRequest {
                    namespace: n,
                    key: "seed/dir".into(),
                    recursive: true,
                    ..Default::default()
                },
            ),
        ]
        .concat(),
    ));
    out
}
