//! The GPU host transport's decoders (`ktfs::gpu::worker::host::frames`) on hostile bytes, as
//! either end reads them before and outside sealing: a worker serving a registration reads a
//! hello and then requests, a worker getting from it reads the verdict on its hello and then
//! answers. Each reader runs over the bytes and is checked against a model of the frames
//! written here from the protocol's description (`ktfs::gpu::worker::host`): a hello
//! `KTGH 4, [registration u64][sealed u8][the first Noise handshake message, 48 bytes]`,
//! requests `[offset u64][len u32]`
//! (`len` all ones: an NCCL offer of `offset` bytes follows), verdicts and answers
//! `[errno u32][len u32]` and then the bytes or the reason, all little-endian.
//!
//! What must hold: every input decodes to exactly what the model says, or to the error it
//! names; nothing panics or hangs; and no reader takes more than the protocol's bound for a
//! length a peer claims (a reason over 4 KiB, an offer over 16 KiB and an answer of another
//! length than asked for are refused by their heads).

use std::time::Duration;

use ktfs::gpu::worker::host::frames::{
    read_answer, read_hello, read_request, read_verdict, Incoming, Want, CHUNK, HEAD, HELLO, MAGIC,
    MAX_OFFER, MAX_WHY, OFFER, REQUEST,
};
use ktfs::gpu::worker::WorkerError;

use crate::rt::runtime;

/// Longer than any read of bytes already in memory takes: reaching it means a reader hangs.
const HANG: Duration = Duration::from_secs(10);

/// Who the client's messages name.
const SOURCE: &str = "the fuzzed peer";
const ADDR: &str = "127.0.0.242:1";

/// The first byte picks the end: even, a serving worker reads the rest as a connection's
/// bytes from its hello on; odd, a getting worker reads the rest past four more bytes (the
/// length it asks of each answer: exactly that, up to a chunk, or with bit 1 of the first byte
/// at most that, up to 64 KiB) as the server's bytes from the verdict on.
pub fn gpu_host_transport(input: &[u8]) {
    let Some((&pick, rest)) = input.split_first() else {
        return;
    };
    runtime().block_on(async {
        let read = async {
            if pick & 1 == 0 {
                server_reads(rest).await;
            } else if let Some((want, stream)) = want_of(pick, rest) {
                client_reads(want, stream).await;
            }
        };
        tokio::time::timeout(HANG, read)
            .await
            .expect("a reader of bytes in memory hung");
    });
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// A serving worker's reads: the hello, then requests up to the connection's end or its first
/// offer (the last request a connection carries).
async fn server_reads(bytes: &[u8]) {
    let mut rd = bytes;
    let hello = read_hello(&mut rd).await;
    if bytes.len() < HELLO {
        assert!(
            matches!(hello, Err(WorkerError::Io(_))),
            "a short hello: {hello:?}"
        );
        return;
    }
    if &bytes[..5] != MAGIC {
        assert!(
            matches!(&hello, Err(WorkerError::Bad(why)) if why.contains("not this version")),
            "another version's hello: {hello:?}"
        );
        return;
    }
    let hello = hello.expect("a hello of this version");
    assert_eq!(hello.registration, u64_at(bytes, 5), "the registration");
    assert_eq!(hello.sealed, bytes[13] != 0, "whether sealed");
    assert_eq!(hello.fresh[..], bytes[14..HELLO], "the fresh value");
    let mut rest = &bytes[HELLO..];
    loop {
        let got = read_request(&mut rd, None).await;
        if rest.len() < REQUEST {
            // Ended, or ended inside a request: nothing more to answer.
            assert!(matches!(got, Ok(Incoming::End)), "at the end: {got:?}");
            return;
        }
        let (offset, len) = (u64_at(rest, 0), u32_at(rest, 8));
        rest = &rest[REQUEST..];
        if len != OFFER {
            assert!(
                matches!(got, Ok(Incoming::Bytes { offset: o, len: l }) if o == offset && l == len),
                "a request for {len} bytes at {offset}: {got:?}"
            );
            continue;
        }
        if offset > MAX_OFFER {
            assert!(
                matches!(&got, Err(WorkerError::Bad(why)) if why.contains("an NCCL offer of")),
                "an offer of {offset} bytes: {got:?}"
            );
        } else if (rest.len() as u64) < offset {
            assert!(
                matches!(got, Err(WorkerError::Io(_))),
                "a cut offer: {got:?}"
            );
        } else {
            let body = &rest[..offset as usize];
            assert!(
                matches!(&got, Ok(Incoming::Offer(b)) if b == body),
                "an offer of {offset} bytes: {got:?}"
            );
        }
        return;
    }
}

/// The length a getting worker asks of each answer, and the server's bytes after it.
fn want_of(pick: u8, rest: &[u8]) -> Option<(Want, &[u8])> {
    let n = u32_at(rest.get(..4)?, 0);
    let want = if pick & 2 == 0 {
        Want::Exactly(n % (CHUNK as u32 + 1))
    } else {
        Want::AtMost(n % ((64 << 10) + 1))
    };
    Some((want, &rest[4..]))
}

/// Whether `e` is the error of a peer that went away mid-transfer (its bytes ended).
fn gone(e: &WorkerError) -> bool {
    match e {
        WorkerError::Remote(errno, why) => {
            *errno == libc::ECONNABORTED && why.contains("went away")
        }
        _ => false,
    }
}

/// Whether `e` is the refusal the peer sent: its errno, and its reason as text.
fn refused(e: &WorkerError, errno: u32, why: &[u8]) -> bool {
    let said = format!("{SOURCE}: {}", String::from_utf8_lossy(why));
    matches!(e, WorkerError::Remote(n, w) if *n == errno as i32 && *w == said)
}

/// A getting worker's reads: the verdict on its hello, then answers up to the first error
/// (every answer past the server's bytes is one: the server went away).
async fn client_reads(want: Want, bytes: &[u8]) {
    let mut rd = bytes;
    let verdict = read_verdict(&mut rd, SOURCE, ADDR).await;
    if bytes.len() < HEAD {
        assert!(
            verdict.as_ref().is_err_and(gone),
            "a short verdict: {verdict:?}"
        );
        return;
    }
    let (errno, len) = (u32_at(bytes, 0), u32_at(bytes, 4));
    let mut rest = &bytes[HEAD..];
    if errno != 0 {
        // A refusal's reason is read up to its bound, whatever the head claims.
        let n = len.min(MAX_WHY) as usize;
        let e = verdict.expect_err("a refusal admitted");
        if rest.len() < n {
            assert!(gone(&e), "a cut refusal: {e:?}");
        } else {
            assert!(refused(&e, errno, &rest[..n]), "a refusal: {e:?}");
        }
        return;
    }
    // An admitted hello's verdict carries nothing, whatever its length says.
    assert!(verdict.is_ok(), "an admitted hello: {verdict:?}");
    loop {
        let got = read_answer(&mut rd, None, SOURCE, ADDR, want).await;
        if rest.len() < HEAD {
            assert!(got.as_ref().is_err_and(gone), "a cut head: {got:?}");
            return;
        }
        let (errno, len) = (u32_at(rest, 0), u32_at(rest, 4));
        rest = &rest[HEAD..];
        let carried = rest.get(..len as usize);
        let e = match got {
            Ok(data) => {
                let bound = match want {
                    Want::Exactly(n) => data.len() == n as usize,
                    Want::AtMost(n) => data.len() <= n as usize,
                };
                assert!(
                    errno == 0 && bound,
                    "{} bytes taken for {want:?}",
                    data.len()
                );
                assert!(Some(&data[..]) == carried, "an answer not as sent");
                rest = &rest[data.len()..];
                continue;
            }
            Err(e) => e,
        };
        // What the head alone refuses, before any byte it announces is read.
        let refused_by_head = match (errno, want) {
            (0, Want::Exactly(n)) if len != n => Some("were asked for"),
            (0, Want::AtMost(n)) if len > n => Some("more than"),
            (0, _) => None,
            _ if len > MAX_WHY => Some("gave a reason of"),
            _ => None,
        };
        if let Some(says) = refused_by_head {
            let named = matches!(&e, WorkerError::Peer(why) if why.contains(says));
            assert!(
                named,
                "a head of {len} bytes, errno {errno}, for {want:?}: {e:?}"
            );
        } else if carried.is_none() {
            assert!(gone(&e), "a cut answer: {e:?}");
        } else if errno == 0 {
            panic!("a whole answer of {len} bytes for {want:?} refused: {e:?}");
        } else {
            let why = carried.unwrap_or_default();
            assert!(refused(&e, errno, why), "a failed request: {e:?}");
        }
        return;
    }
}
