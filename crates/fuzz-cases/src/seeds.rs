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

/// A seed: its target, its file name, its bytes.
type Seed = (&'static str, &'static str, Vec<u8>);

/// Every seed.
pub fn seeds() -> Vec<Seed> {
    let mut out = data_plane();
    out.extend(manifests_and_keys());
    out.extend(gpu_ioctls());
    out.extend(gpu_host_transport());
    out.push(grpc_publish_resolve_rename_remove());
    out.extend(grpc_batches());
    out.extend(grpc_watches());
    out.push(grpc_list_ahead());
    out.push(grpc_directory_and_broadcast());
    out
}

/// A server's requests (a PUT and GETs, a GET_NOW and delta GETs), a client's answers.
fn data_plane() -> Vec<Seed> {
    let x = BlockHash::of(b"x");
    let zero = [0u8; 32];
    vec![
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
    ]
}

fn manifests_and_keys() -> Vec<Seed> {
    vec![
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
    ]
}

/// A PUT and a GET of one host buffer, a JOIN, a STATUS.
fn gpu_ioctls() -> Vec<Seed> {
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
    vec![
        ("gpu_ioctl", "put", ioctl(0x80, &buffers)),
        ("gpu_ioctl", "get", ioctl(0x81, &buffers)),
        (
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
        ),
        (
            "gpu_ioctl",
            "status",
            ioctl(0x83, &[&7u64.to_le_bytes(), &[0u8; 280]]),
        ),
    ]
}

/// A host transport request (`[offset u64][len u32]`, an offer's `len` all ones).
fn host_request(offset: u64, len: u32) -> Vec<u8> {
    [&offset.to_le_bytes()[..], &len.to_le_bytes()].concat()
}

/// A host transport verdict's or answer's head and what follows it.
fn host_answer(errno: u32, body: &[u8]) -> Vec<u8> {
    [
        &errno.to_le_bytes()[..],
        &(body.len() as u32).to_le_bytes(),
        body,
    ]
    .concat()
}

/// What a serving worker reads (a hello, requests for bytes, an offer) and what a getting
/// worker reads (a verdict and answers of 5 bytes, or a refusal).
fn gpu_host_transport() -> Vec<Seed> {
    let hello = [&b"KTGH\x04"[..], &7u64.to_le_bytes(), &[0], &[0x5a; 48]].concat();
    let exactly_5 = [&[0x01][..], &5u32.to_le_bytes()].concat();
    vec![
        (
            "gpu_host_transport",
            "server-requests-and-an-offer",
            [
                &[0x00][..],
                &hello,
                &host_request(0, 4 << 20),
                &host_request(4 << 20, 12345),
                &host_request(5, u32::MAX),
                b"offer",
            ]
            .concat(),
        ),
        (
            "gpu_host_transport",
            "client-answers",
            [
                &exactly_5[..],
                &host_answer(0, b""),
                &host_answer(0, b"bytes"),
                &host_answer(0, b"more!"),
                &host_answer(22, b"4 bytes at 9 are not within the registration"),
            ]
            .concat(),
        ),
        (
            "gpu_host_transport",
            "client-refused",
            [&exactly_5[..], &host_answer(2, b"no registration 7 here")].concat(),
        ),
    ]
}

fn register_node() -> RegisterNodeRequest {
    RegisterNodeRequest {
        node: Some(NodeInfo {
            node_id: "n1".into(),
            data_addr: "127.0.0.243:7448".into(),
            zone: "z".into(),
        }),
    }
}

/// A PUT of "hello" at `key` in team-a, its block inline.
fn publish(key: &str) -> PublishRequest {
    PublishRequest {
        namespace: "team-a".into(),
        key: key.into(),
        manifest: Some(file_manifest(b"hello")),
        inline_blocks: vec![InlineBlock {
            hash: BlockHash::of(b"hello").0.to_vec(),
            data: b"hello".to_vec(),
        }],
        force: true,
        ..Default::default()
    }
}

/// One PublishBatch of `keys` in team-a.
fn batch(keys: &[&str]) -> Vec<u8> {
    call(
        19,
        &PublishBatchRequest {
            namespace: "team-a".into(),
            items: keys.iter().map(|k| publish(k)).collect(),
            watcher: 0,
        },
    )
}

fn grpc_publish_resolve_rename_remove() -> Seed {
    let version = ktfs::manifest::version_of(&file_manifest(b"hello"))
        .0
        .to_vec();
    let (n, k) = ("team-a".to_string(), "seed/a".to_string());
    (
        "grpc_handlers",
        "publish-resolve-rename-remove",
        [
            call(0, &register_node()),
            call(3, &publish(&k)),
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
                    version,
                    node_id: "n1".into(),
                    ..Default::default()
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
                    from: k,
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
                    namespace: n,
                    key: "seed".into(),
                    prefix: true,
                    ..Default::default()
                },
            ),
        ]
        .concat(),
    )
}

/// A batch of two good items, one below a file (refused alone), one key twice; and many keys
/// resolved at once: two published, one missing, one malformed.
fn grpc_batches() -> Vec<Seed> {
    vec![
        (
            "grpc_handlers",
            "publish-batch",
            [
                call(0, &register_node()),
                batch(&["batch/a", "batch/a/below", "batch/b", "batch/a"]),
            ]
            .concat(),
        ),
        (
            "grpc_handlers",
            "resolve-many",
            [
                call(0, &register_node()),
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
        ),
    ]
}

/// A watch that acknowledges every change, renewed once, then a publish it is told of; and one
/// that acknowledges nothing, whose lease the next publish waits out.
fn grpc_watches() -> Vec<Seed> {
    [("watch-acked", 2), ("watch-silent", 1)]
        .into_iter()
        .map(|(name, renew)| {
            (
                "grpc_handlers",
                name,
                [
                    call(0, &register_node()),
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
                    call(3, &publish("watched/a")),
                ]
                .concat(),
            )
        })
        .collect()
}

/// A listing with those a walk reads next: a tree two levels deep, listed from inside it.
fn grpc_list_ahead() -> Seed {
    (
        "grpc_handlers",
        "list-ahead",
        [
            call(0, &register_node()),
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
    )
}

/// A directory published and joined in a window, a GPU window joined and awaited.
fn grpc_directory_and_broadcast() -> Seed {
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
    let n = "team-a".to_string();
    (
        "grpc_handlers",
        "directory-and-broadcast",
        [
            call(0, &register_node()),
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
                    hashes: vec![BlockHash::of(b"x").0.to_vec(), vec![1; 32]],
                    namespace: String::new(),
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
    )
}
