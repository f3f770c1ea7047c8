//! Hostile input, generated: whatever bytes reach the data-plane decoders (a server's and a
//! client's), the manifest decoder and validator, the GPU ioctl decoder and the key parsers,
//! the answer is a value or an error, never a panic, and what is accepted keeps the invariants
//! the rest of ktfs relies on. Proptest keeps every failing case it finds in
//! `tests/hostile.proptest-regressions`, and runs those first from then on.

use std::time::Duration;

use proptest::prelude::*;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use ktfs::auth::ticket::{shared, Gate};
use ktfs::blocks::{BlockError, BlockServe, Served};
use ktfs::dataplane::wire;
use ktfs::gpu::abi::{self, Command, KT_GPU_GET, KT_GPU_JOIN, KT_GPU_PUT, KT_GPU_STATUS};
use ktfs::hash::BlockHash;
use ktfs::key::{KeyPath, Namespace, MAX_KEY};
use ktfs::manifest::{self, Manifest};
use ktfs::proto::{BlockRef, EntryKind, FileEntry};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn keys_parse_or_refuse_and_what_parses_is_clean(raw in "(/?[a-z.\u{0}é]{0,4}){0,5}/?") {
        if let Ok(k) = KeyPath::parse(&raw) {
            let s = k.as_str();
            prop_assert!(!s.is_empty() && s.len() <= MAX_KEY);
            prop_assert!(!s.starts_with('/') && !s.ends_with('/'));
            prop_assert!(s.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != ".."));
            prop_assert!(!s.contains('\0'));
            let again = KeyPath::parse(s).unwrap();
            prop_assert_eq!(again.as_str(), s);
        }
        let _ = Namespace::parse(&raw);
        let _ = KeyPath::parse_prefix(&raw);
    }

    #[test]
    fn any_bytes_decoded_as_a_manifest_validate_or_refuse(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(m) = Manifest::decode(&bytes[..]) {
            if manifest::validate(&m).is_ok() {
                accepted_manifest_holds(&m)?;
            }
        }
    }

    #[test]
    fn made_up_manifests_validate_or_refuse(m in manifests()) {
        if manifest::validate(&m).is_ok() {
            accepted_manifest_holds(&m)?;
        }
    }

    #[test]
    fn any_ioctl_decodes_or_is_refused(
        which in 0usize..5,
        raw_cmd in any::<u32>(),
        bytes in proptest::collection::vec(any::<u8>(), 0..4096),
        exact in any::<bool>(),
    ) {
        let cmd = [KT_GPU_PUT, KT_GPU_GET, KT_GPU_JOIN, KT_GPU_STATUS, raw_cmd][which];
        // Most random lengths are refused at once; the exact size reaches the field decoders.
        let want = ((cmd >> 16) & 0x3fff) as usize;
        let mut data = bytes;
        if exact {
            data.resize(want, 0xa5);
        }
        if let Ok(Command::Join(w)) = abi::decode(cmd, &data) {
            let _ = abi::text(&w.group_id, "group_id");
            let _ = abi::text(&w.ips, "ips");
        }
    }
}

/// What every reader of an accepted manifest relies on.
fn accepted_manifest_holds(m: &Manifest) -> Result<(), TestCaseError> {
    let mut prev: Option<&str> = None;
    for e in &m.entries {
        if let Some(p) = prev {
            prop_assert!(p < e.path.as_str(), "unsorted");
        }
        prev = Some(&e.path);
        if e.kind() == EntryKind::File {
            let sum: u64 = e.blocks.iter().map(|b| u64::from(b.len)).sum();
            prop_assert_eq!(sum, e.size);
            for b in &e.blocks {
                prop_assert!(b.len > 0 && b.len <= m.block_size && b.hash.len() == 32);
            }
        }
    }
    Ok(())
}

fn manifests() -> impl Strategy<Value = Manifest> {
    let path = prop::sample::select(vec![
        "", "a", "a/b", "a/b/c", "b", "..", "a//b", "/x", "a/.",
    ]);
    let block = (
        0u8..4,
        prop::sample::select(vec![0u32, 1, 7, 1024, 4096, u32::MAX]),
    )
        .prop_map(|(h, len)| BlockRef {
            hash: if h == 3 { vec![h; 7] } else { vec![h; 32] },
            len,
        });
    let entry = (
        path,
        0i32..6,
        prop::sample::select(vec![0u64, 1, 7, 1024, 8192, u64::MAX]),
        proptest::collection::vec(block, 0..4),
    )
        .prop_map(|(path, kind, size, blocks)| FileEntry {
            path: path.to_string(),
            kind,
            size,
            blocks,
            ..Default::default()
        });
    (
        prop::sample::select(vec![0u32, 1, 1024, 4096, u32::MAX]),
        proptest::collection::vec(entry, 0..6),
    )
        .prop_map(|(block_size, entries)| Manifest {
            block_size,
            entries,
        })
}

/// A data-plane server over a few blocks, with its address.
struct Few;
impl BlockServe for Few {
    fn get(&self, hash: &BlockHash) -> Result<Option<Served>, BlockError> {
        Ok((*hash == BlockHash::of(b"x")).then(|| Served::Bytes(bytes::Bytes::from_static(b"x"))))
    }
    fn put(&self, _hash: &BlockHash, _data: bytes::Bytes) -> Result<(), BlockError> {
        Ok(())
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn a_server_survives_any_bytes_after_the_hello(junk in proptest::collection::vec(any::<u8>(), 0..2048)) {
        runtime().block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.191:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let served = tokio::spawn(async move {
                let (s, _) = listener.accept().await.unwrap();
                wire::serve_connection(ktfs::auth::tls::Conn::Plain(s), std::sync::Arc::new(Few), shared(Gate::Open), Default::default()).await;
            });
            let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
            c.write_all(b"KTDP\x01").await.unwrap();
            let _ = c.write_all(&junk).await;
            let _ = c.shutdown().await;
            let mut sink = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut sink)).await;
            // The connection's task ended by itself, without a panic.
            let ended = tokio::time::timeout(Duration::from_secs(5), served).await;
            assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
        });
    }

    #[test]
    fn a_client_survives_any_bytes_from_a_peer(junk in proptest::collection::vec(any::<u8>(), 0..2048)) {
        runtime().block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.191:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            tokio::spawn(async move {
                let (mut s, _) = listener.accept().await.unwrap();
                let _ = s.write_all(&junk).await;
                let _ = s.shutdown().await;
            });
            let (mut tx, mut rx) = wire::connect(&addr, wire::Peer::Store).await.unwrap();
            let _ = tx.get(&BlockHash::of(b"x")).await;
            // Answers are values or errors until the peer's bytes run out.
            for _ in 0..64 {
                if rx.recv().await.is_err() {
                    break;
                }
            }
        });
    }
}
