//! The data plane's frame decoders, a server's and a client's, over real loopback sockets (the
//! decoders read a `Conn`, which is TCP). Each side is checked against a model of the protocol
//! written here from its description in `ktfs::dataplane::wire`: frames `[op][len u32 BE]
//! [payload]`, a payload a 32-byte hash and a body (for a delta upload, the base's hash first).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use ktfs::auth::ticket::{shared, Gate};
use ktfs::blocks::{BlockError, BlockServe, Served};
use ktfs::dataplane::wire::{self, Response, WireError, MAX_FRAME};
use ktfs::hash::BlockHash;

use crate::rt::{listener, runtime};

const OP_GET: u8 = 1;
const OP_PUT: u8 = 2;
const OP_TICKET: u8 = 3;
const OP_SIGNATURE: u8 = 4;
const OP_PUT_DELTA: u8 = 5;
const OP_GET_SWARM: u8 = 6;
const OP_GET_DELTA: u8 = 7;
const OP_GET_NOW: u8 = 8;
const OP_BLOCK: u8 = 0x81;
const OP_NOT_FOUND: u8 = 0x82;
const OP_STORED: u8 = 0x83;
const OP_ERROR: u8 = 0x84;
const OP_NO_SPACE: u8 = 0x85;
const OP_SIG: u8 = 0x86;
const OP_BUSY: u8 = 0x87;
const OP_DELTA: u8 = 0x88;

/// Longer than any answer takes on loopback: reaching it means a side hangs.
const HANG: Duration = Duration::from_secs(10);

/// One frame as the protocol defines it, or why the bytes stop being frames.
#[derive(Debug, PartialEq)]
enum Frame<'a> {
    Whole {
        op: u8,
        payload: &'a [u8],
    },
    /// The bytes end inside a frame's 5-byte head, this many bytes into it (0: between frames).
    EndInHead(usize),
    TooLarge(usize),
    /// The bytes end inside a payload.
    EndInPayload,
}

fn frames(mut rest: &[u8]) -> Vec<Frame<'_>> {
    let mut out = Vec::new();
    loop {
        if rest.len() < 5 {
            out.push(Frame::EndInHead(rest.len()));
            return out;
        }
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        if len > MAX_FRAME {
            out.push(Frame::TooLarge(len));
            return out;
        }
        if rest.len() - 5 < len {
            out.push(Frame::EndInPayload);
            return out;
        }
        out.push(Frame::Whole {
            op: rest[0],
            payload: &rest[5..5 + len],
        });
        rest = &rest[5 + len..];
    }
}

fn hash_of(payload: &[u8]) -> BlockHash {
    BlockHash::from_slice(&payload[..32]).expect("32 bytes")
}

/// Blocks in memory, fresh for every run, so that one run's uploads never answer another's.
#[derive(Default)]
struct Mem(Mutex<HashMap<BlockHash, Bytes>>);

impl BlockServe for Mem {
    fn get(&self, hash: &BlockHash) -> Result<Option<Served>, BlockError> {
        let held = self.0.lock().expect("lock").get(hash).cloned();
        Ok(held.map(Served::Bytes))
    }
    fn put(&self, hash: &BlockHash, data: Bytes) -> Result<(), BlockError> {
        self.0.lock().expect("lock").insert(*hash, data);
        Ok(())
    }
}

/// What the server owes one request, in order.
#[derive(Debug)]
enum Owed {
    /// A GET: the block if a PUT of this run stores it (pipelined requests run at once, so a
    /// later one may have, an earlier one not yet), else "not found". A swarm member's GET may
    /// also be answered "busy" (the server's upload slots are taken).
    Get {
        hash: BlockHash,
        may_have: bool,
        swarm: bool,
    },
    /// A PUT: "stored" if the body hashes to its hash, else an error.
    Put { hash: BlockHash, matches: bool },
    /// A signature request: a signature if a PUT of this run stores the block, else "not
    /// found".
    Signature { hash: BlockHash, may_have: bool },
    /// A delta upload: "stored" (only a delta that rebuilds its hash), an error, or "not
    /// found" naming the base.
    PutDelta { hash: BlockHash, base: BlockHash },
    /// A getter's delta request (the body its signature): if a PUT of this run stores the
    /// block, a delta or the block whole; an error for a body that is no signature; else "not
    /// found".
    GetDelta { hash: BlockHash, may_have: bool },
}

/// The requests a server must answer among `input`: those before the first frame that ends
/// the connection.
fn owed(input: &[u8]) -> Vec<Owed> {
    let mut out = Vec::new();
    for f in frames(input) {
        let Frame::Whole { op, payload } = f else {
            break;
        };
        if op == OP_TICKET {
            // An open gate admits every ticket as nothing and answers none.
            continue;
        }
        if payload.len() < 32 {
            break;
        }
        let (hash, body) = (hash_of(payload), &payload[32..]);
        match op {
            OP_GET | OP_GET_SWARM | OP_GET_NOW if body.is_empty() => out.push(Owed::Get {
                hash,
                may_have: false,
                swarm: op == OP_GET_SWARM,
            }),
            OP_PUT => out.push(Owed::Put {
                hash,
                matches: BlockHash::of(body) == hash,
            }),
            OP_SIGNATURE if body.is_empty() => out.push(Owed::Signature {
                hash,
                may_have: false,
            }),
            OP_PUT_DELTA if body.len() >= 32 => out.push(Owed::PutDelta {
                hash,
                base: hash_of(body),
            }),
            OP_GET_DELTA => out.push(Owed::GetDelta {
                hash,
                may_have: false,
            }),
            _ => break,
        }
    }
    let stored: HashSet<BlockHash> = out
        .iter()
        .filter_map(|o| match o {
            Owed::Put {
                hash,
                matches: true,
            } => Some(*hash),
            // The server checks what a delta rebuilds; the model cannot, so it may have.
            Owed::PutDelta { hash, .. } => Some(*hash),
            _ => None,
        })
        .collect();
    for o in &mut out {
        if let Owed::Get { hash, may_have, .. }
        | Owed::Signature { hash, may_have }
        | Owed::GetDelta { hash, may_have } = o
        {
            *may_have = stored.contains(hash);
        }
    }
    out
}

fn server_listener() -> &'static TcpListener {
    static L: OnceLock<TcpListener> = OnceLock::new();
    L.get_or_init(|| listener("127.0.0.240"))
}

/// Any bytes after a good hello, sent to a data-plane server over a fresh store: the server's
/// task ends by itself once the bytes end, and it answers exactly the well-formed requests
/// before the first malformed frame, in order, each as the protocol says.
pub fn data_plane_server(input: &[u8]) {
    runtime().block_on(async {
        let l = server_listener();
        let Ok(addr) = l.local_addr() else { return };
        // A harness that cannot connect tells nothing about the server: no finding.
        let Ok(mut c) = TcpStream::connect(addr).await else {
            return;
        };
        let Ok(Ok((s, _))) = tokio::time::timeout(HANG, l.accept()).await else {
            return;
        };
        let served = tokio::spawn(wire::serve_connection(
            ktfs::auth::tls::Conn::Plain(s),
            Arc::new(Mem::default()),
            shared(Gate::Open),
            Arc::default(),
        ));
        let mut sent = wire::MAGIC.to_vec();
        sent.push(1);
        sent.extend_from_slice(input);
        // The server may stop reading at a malformed frame: a refused write is no finding.
        let _ = c.write_all(&sent).await;
        let _ = c.shutdown().await;
        let mut got = Vec::new();
        let read = tokio::time::timeout(HANG, c.read_to_end(&mut got))
            .await
            .expect("the server neither answered nor closed within 10 s of the input's end");
        let ended = tokio::time::timeout(HANG, served).await;
        assert!(
            matches!(ended, Ok(Ok(()))),
            "the connection's task did not end cleanly: {ended:?}"
        );
        // A server that closes with input unread resets the connection; what it wrote before
        // still arrives, but may be cut short, so then only a prefix is owed.
        let complete = read.is_ok();
        check_answers(&owed(input), &got, complete);
    });
}

fn check_answers(owed: &[Owed], got: &[u8], complete: bool) {
    let answers = frames(got);
    let (last, answers) = answers.split_last().expect("frames ends with an end");
    if complete {
        assert_eq!(
            *last,
            Frame::EndInHead(0),
            "the server's answers end inside a frame"
        );
        assert!(
            answers.len() == owed.len(),
            "{} answers to {} requests: {owed:?}",
            answers.len(),
            owed.len()
        );
    } else {
        assert!(answers.len() <= owed.len(), "more answers than requests");
    }
    for (i, (a, o)) in answers.iter().zip(owed).enumerate() {
        let Frame::Whole { op, payload } = a else {
            unreachable!("split_last left only frames")
        };
        assert!(
            payload.len() >= 32,
            "answer {i}: payload of {} bytes",
            payload.len()
        );
        let (hash, body) = (hash_of(payload), &payload[32..]);
        match (o, *op) {
            (
                Owed::Get {
                    hash: h, may_have, ..
                },
                OP_BLOCK,
            ) => {
                assert!(*may_have, "answer {i}: a block nobody stored");
                assert_eq!(hash, *h, "answer {i}: another block's hash");
                assert_eq!(
                    BlockHash::of(body),
                    *h,
                    "answer {i}: bytes not of their hash"
                );
            }
            (Owed::Get { hash: h, .. }, OP_NOT_FOUND)
            | (
                Owed::Get {
                    hash: h,
                    swarm: true,
                    ..
                },
                OP_BUSY,
            ) => {
                assert_eq!(hash, *h, "answer {i}: another block's hash");
                assert!(body.is_empty(), "answer {i}: op {op:#x} with a body");
            }
            (
                Owed::Put {
                    hash: h,
                    matches: true,
                },
                OP_STORED,
            ) => {
                assert_eq!(hash, *h, "answer {i}: another block's hash");
            }
            (Owed::Put { matches: false, .. }, OP_ERROR) => {}
            (Owed::Signature { hash: h, may_have }, OP_SIG) => {
                assert!(
                    *may_have,
                    "answer {i}: a signature of a block nobody stored"
                );
                assert_eq!(hash, *h, "answer {i}: another block's hash");
                assert!(!body.is_empty(), "answer {i}: an empty signature");
            }
            (Owed::Signature { hash: h, .. }, OP_NOT_FOUND)
            | (Owed::PutDelta { hash: h, .. }, OP_STORED)
            | (Owed::PutDelta { base: h, .. }, OP_NOT_FOUND) => {
                assert_eq!(hash, *h, "answer {i}: another block's hash");
            }
            (Owed::PutDelta { .. }, OP_ERROR) => {}
            (Owed::GetDelta { hash: h, may_have }, OP_DELTA | OP_BLOCK) => {
                assert!(*may_have, "answer {i}: a block nobody stored");
                assert_eq!(hash, *h, "answer {i}: another block's hash");
                if *op == OP_BLOCK {
                    assert_eq!(
                        BlockHash::of(body),
                        *h,
                        "answer {i}: bytes not of their hash"
                    );
                }
            }
            (Owed::GetDelta { hash: h, .. }, OP_NOT_FOUND) => {
                assert_eq!(hash, *h, "answer {i}: another block's hash");
            }
            (Owed::GetDelta { may_have: true, .. }, OP_ERROR) => {}
            (o, op) => panic!("answer {i}: op {op:#x} to {o:?}"),
        }
    }
}

fn client_listener() -> &'static TcpListener {
    static L: OnceLock<TcpListener> = OnceLock::new();
    L.get_or_init(|| listener("127.0.0.241"))
}

/// Any bytes from a peer, read by a data-plane client that sent it a GET: every answer the
/// client returns is the frame the bytes hold, byte for byte, and the first bytes that are no
/// answer end it with the error that names them.
pub fn data_plane_client(input: &[u8]) {
    runtime().block_on(async {
        let l = client_listener();
        let Ok(addr) = l.local_addr() else { return };
        let Ok((mut tx, mut rx)) = wire::connect(&addr.to_string(), wire::Peer::Store).await else {
            return;
        };
        let Ok(Ok((mut peer, _))) = tokio::time::timeout(HANG, l.accept()).await else {
            return;
        };
        let junk = input.to_vec();
        let peer = tokio::spawn(async move {
            let _ = peer.write_all(&junk).await;
            let _ = peer.shutdown().await;
            // Reads what the client sent, so that closing resets nothing.
            let mut sink = Vec::new();
            let _ = tokio::time::timeout(HANG, peer.read_to_end(&mut sink)).await;
        });
        let _ = tx.get(&BlockHash::of(b"x")).await;
        for (i, f) in frames(input).into_iter().enumerate() {
            let got = tokio::time::timeout(HANG, rx.recv())
                .await
                .expect("the client hung on a peer that had closed");
            if let Err(WireError::Io(_)) = got {
                // The socket failed under the harness: nothing to judge the decoder by.
                break;
            }
            let done = check_client_answer(i, &f, got);
            if done {
                break;
            }
        }
        drop((tx, rx));
        let _ = peer.await;
    });
}

/// Checks answer `i`; true where it had to be the last.
fn check_client_answer(i: usize, f: &Frame<'_>, got: Result<Response, WireError>) -> bool {
    match f {
        Frame::EndInHead(_) | Frame::EndInPayload => {
            assert!(
                matches!(got, Err(WireError::Closed)),
                "{i}: {got:?} at the end"
            );
            true
        }
        Frame::TooLarge(len) => {
            assert!(
                matches!(got, Err(WireError::FrameTooLarge(n)) if n == *len),
                "{i}: {got:?} for a frame of {len} bytes"
            );
            true
        }
        Frame::Whole { payload, .. } if payload.len() < 32 => {
            assert!(matches!(got, Err(WireError::BadFrame(_))), "{i}: {got:?}");
            true
        }
        Frame::Whole { op, payload } => {
            let (hash, body) = (hash_of(payload), &payload[32..]);
            let text = String::from_utf8_lossy(body);
            match (*op, got) {
                (OP_BLOCK, Ok(Response::Block(h, b))) => {
                    assert!(h == hash && b[..] == *body, "{i}: a block not as sent")
                }
                (OP_NOT_FOUND, Ok(Response::NotFound(h)))
                | (OP_STORED, Ok(Response::Stored(h))) => assert_eq!(h, hash, "{i}"),
                (OP_ERROR, Ok(Response::Error(m))) | (OP_NO_SPACE, Ok(Response::NoSpace(m))) => {
                    assert_eq!(m, text, "{i}: a message not as sent")
                }
                (OP_SIG, Ok(Response::Signature(h, b))) => {
                    assert!(h == hash && b[..] == *body, "{i}: a signature not as sent")
                }
                (OP_BUSY, Ok(Response::Busy(h))) => assert_eq!(h, hash, "{i}"),
                (OP_DELTA, Ok(Response::Delta(h, b))) => {
                    assert!(h == hash && b[..] == *body, "{i}: a delta not as sent")
                }
                (OP_BLOCK..=OP_DELTA, got) => panic!("{i}: op {op:#x} read as {got:?}"),
                (_, got) => {
                    assert!(
                        matches!(got, Err(WireError::BadFrame(_))),
                        "{i}: op {op:#x}: {got:?}"
                    );
                    return true;
                }
            }
            false
        }
    }
}
