//! The host transport's frames as both ends write and read them: the hello, a request (or an
//! offer's), the head of a verdict or an answer; and the readers that take each off a
//! connection, unsealed or, given the direction's keys, sealed.
//!
//! The readers are also the decoders the `gpu_host_transport` fuzz target runs on hostile
//! bytes (`crates/fuzz-cases`): bytes that are no frame give an error, never a panic, and no
//! length a peer claims is allocated before it is checked against its bound ([`MAX_WHY`],
//! [`MAX_OFFER`], the length asked for).

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::auth::sealed::{Direction, Hello as Fresh, HANDSHAKE, TAG};
use crate::gpu::worker::error::WorkerError;

/// The first bytes of a hello: `KTGH` and the version.
pub const MAGIC: &[u8; 5] = b"KTGH\x04";
/// A hello's length: the magic, the registration, whether sealed, the client's first handshake
/// message (zeros where unsealed).
pub const HELLO: usize = 5 + 8 + 1 + HANDSHAKE;
/// A request's length (unsealed): `[offset u64][len u32]`.
pub const REQUEST: usize = 12;
/// A verdict's or an answer's head (unsealed): `[errno u32][len u32]`.
pub const HEAD: usize = 8;
/// The longest message a refusal or a failed request carries.
pub const MAX_WHY: u32 = 4096;
/// Bytes per request.
pub const CHUNK: u64 = 4 << 20;
/// The length of a request that carries an NCCL offer (a request for bytes asks for at most
/// [`CHUNK`]); its offset is the offer's length.
pub const OFFER: u32 = u32::MAX;
/// The longest offer's body: an id, [`KEEP`](crate::gpu::worker::comms::KEEP) keys, a name.
pub const MAX_OFFER: u64 = 16 << 10;
/// Chunks being made ready at once on either side of a connection (read and sealed, opened and
/// written), beyond the one on the wire: enough to keep two cores busy, few enough that a
/// connection holds little memory.
pub const OVERLAP: usize = 2;

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(w)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// A verdict's or an answer's head, with room for its tag where it is to be sealed.
pub fn head(errno: u32, len: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEAD + TAG);
    h.extend_from_slice(&errno.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h
}

/// A request for `len` bytes at `offset` of the run (or, with `len` [`OFFER`], an offer of
/// `offset` bytes), with room for its tag.
pub fn request(offset: u64, len: u32) -> Vec<u8> {
    let mut req = Vec::with_capacity(REQUEST + TAG);
    req.extend_from_slice(&offset.to_le_bytes());
    req.extend_from_slice(&len.to_le_bytes());
    req
}

/// What opens a connection: the registration it is for, whether it is to be sealed, and the
/// client's first handshake message (what the keys come from, with the server's answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub registration: u64,
    pub sealed: bool,
    pub fresh: Fresh,
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let mut hello = Vec::with_capacity(HELLO);
        hello.extend_from_slice(MAGIC);
        hello.extend_from_slice(&self.registration.to_le_bytes());
        hello.push(u8::from(self.sealed));
        hello.extend_from_slice(&self.fresh);
        hello
    }

    /// The hello `b` holds; any byte but 0 says sealed.
    pub fn decode(b: &[u8; HELLO]) -> Result<Hello, WorkerError> {
        if &b[..5] != MAGIC {
            return Err(WorkerError::Bad(
                "not this version of the ktfs host transport".into(),
            ));
        }
        let mut fresh = [0u8; HANDSHAKE];
        fresh.copy_from_slice(&b[14..]);
        Ok(Hello {
            registration: u64_at(b, 5),
            sealed: b[13] != 0,
            fresh,
        })
    }
}

/// The hello that opens a connection, as its server reads it.
pub async fn read_hello<R: AsyncRead + Unpin>(rd: &mut R) -> Result<Hello, WorkerError> {
    let mut b = [0u8; HELLO];
    rd.read_exact(&mut b).await?;
    Hello::decode(&b)
}

/// What a server reads next on a connection past its hello.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming {
    /// A request for `len` bytes at `offset` of the run (not yet checked against it).
    Bytes { offset: u64, len: u32 },
    /// An NCCL offer's body, opened where the connection is sealed.
    Offer(Vec<u8>),
    /// A request that the connection's keys do not open (sealed connections only).
    Unopened,
    /// The connection ended, or ended inside a request: there is nothing more to answer.
    End,
}

/// The next request on a connection; `opener` opens it (and an offer's body) where the
/// connection is sealed.
pub async fn read_request<R: AsyncRead + Unpin>(
    rd: &mut R,
    mut opener: Option<&mut Direction>,
) -> Result<Incoming, WorkerError> {
    let tag = if opener.is_some() { TAG } else { 0 };
    let mut req = vec![0u8; REQUEST + tag];
    match rd.read_exact(&mut req).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(Incoming::End),
        Err(e) => return Err(WorkerError::from(e)),
    }
    if let Some(o) = opener.as_mut() {
        if !o.open(&mut req) {
            return Ok(Incoming::Unopened);
        }
    }
    let (offset, len) = (u64_at(&req, 0), u32_at(&req, 8));
    if len == OFFER {
        return Ok(Incoming::Offer(read_offer(rd, opener, offset).await?));
    }
    Ok(Incoming::Bytes { offset, len })
}

/// An offer's body of `len` bytes, opened where the connection is sealed.
async fn read_offer<R: AsyncRead + Unpin>(
    rd: &mut R,
    opener: Option<&mut Direction>,
    len: u64,
) -> Result<Vec<u8>, WorkerError> {
    if len > MAX_OFFER {
        return Err(WorkerError::Bad(format!("an NCCL offer of {len} bytes")));
    }
    let tag = if opener.is_some() { TAG } else { 0 };
    let mut body = vec![0u8; len as usize + tag];
    rd.read_exact(&mut body).await?;
    if let Some(o) = opener {
        if !o.open(&mut body) {
            return Err(WorkerError::Bad(
                "an NCCL offer that the registration's secret does not open".into(),
            ));
        }
    }
    Ok(body)
}

/// The verdict on a hello, as its client reads it from `source` at `addr`: a refusal is the
/// error it carries.
pub async fn read_verdict<R: AsyncRead + Unpin>(
    rd: &mut R,
    source: &str,
    addr: &str,
) -> Result<(), WorkerError> {
    let mut verdict = [0u8; HEAD];
    rd.read_exact(&mut verdict)
        .await
        .map_err(|e| peer_failed(source, addr, e))?;
    let (errno, len) = (u32_at(&verdict, 0), u32_at(&verdict, 4));
    if errno != 0 {
        return Err(refusal(rd, errno, len, source, addr).await);
    }
    Ok(())
}

/// The reason a refused hello carries, as the error it is.
async fn refusal<R: AsyncRead + Unpin>(
    rd: &mut R,
    errno: u32,
    len: u32,
    source: &str,
    addr: &str,
) -> WorkerError {
    let mut why = vec![0u8; len.min(MAX_WHY) as usize];
    if let Err(e) = rd.read_exact(&mut why).await {
        return peer_failed(source, addr, e);
    }
    WorkerError::Remote(
        errno as i32,
        format!("{source}: {}", String::from_utf8_lossy(&why)),
    )
}

/// A connection to a peer worker that failed: one that ended mid-transfer is a member gone
/// (closed, or dead before its buffers' failure reached us), as ECONNABORTED says.
pub fn peer_failed(source: &str, addr: &str, e: std::io::Error) -> WorkerError {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    match e.kind() {
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => WorkerError::Remote(
            libc::ECONNABORTED,
            format!("{source} ({addr}) went away mid-transfer: {e}"),
        ),
        _ => WorkerError::Peer(format!("{source} ({addr}): {e}")),
    }
}

/// How long an answer must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// The bytes a request asked for.
    Exactly(u32),
    AtMost(u32),
}

/// The next answer from `source` at `addr`: its bytes as they came (still sealed on a sealed
/// connection, where `opener` opens only the head), once its head said it carries as many
/// bytes as `want`. An answer that carries an errno is the error it says.
pub async fn read_answer<R: AsyncRead + Unpin>(
    rd: &mut R,
    opener: Option<&mut Direction>,
    source: &str,
    addr: &str,
    want: Want,
) -> Result<Vec<u8>, WorkerError> {
    let peer = |e: std::io::Error| peer_failed(source, addr, e);
    let tag = if opener.is_some() { TAG } else { 0 };
    let mut h = vec![0u8; HEAD + tag];
    rd.read_exact(&mut h).await.map_err(peer)?;
    let mut opener = opener;
    if let Some(o) = opener.as_mut() {
        if !o.open(&mut h) {
            return Err(WorkerError::Remote(
                libc::EACCES,
                format!(
                    "{source} ({addr}) answered under keys that the registration's secret does \
                     not open: the secrets differ"
                ),
            ));
        }
    }
    let errno = u32_at(&h, 0);
    let got = u32_at(&h, 4);
    if errno != 0 {
        if got > MAX_WHY {
            return Err(WorkerError::Peer(format!(
                "{source} ({addr}) gave a reason of {got} bytes"
            )));
        }
        let mut why = vec![0u8; got as usize + tag];
        rd.read_exact(&mut why).await.map_err(peer)?;
        if let Some(o) = opener {
            if !o.open(&mut why) {
                why = b"(a reason the registration's secret does not open)".to_vec();
            }
        }
        return Err(WorkerError::Remote(
            errno as i32,
            format!("{source}: {}", String::from_utf8_lossy(&why)),
        ));
    }
    match want {
        Want::Exactly(len) if got != len => {
            return Err(WorkerError::Peer(format!(
                "{source} ({addr}) sent {got} bytes, {len} were asked for"
            )))
        }
        Want::AtMost(max) if got > max => {
            return Err(WorkerError::Peer(format!(
                "{source} ({addr}) sent an answer of {got} bytes, more than {max}"
            )))
        }
        _ => {}
    }
    let mut data = vec![0u8; got as usize + tag];
    rd.read_exact(&mut data).await.map_err(peer)?;
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hello_and_requests_read_back_as_written() {
        let hello = Hello {
            registration: 0x0102_0304_0506_0708,
            sealed: true,
            fresh: [7; HANDSHAKE],
        };
        let mut wire = hello.encode();
        assert_eq!(wire.len(), HELLO);
        wire.extend_from_slice(&request(4096, 12));
        wire.extend_from_slice(&request(3, OFFER));
        wire.extend_from_slice(b"abc");
        wire.extend_from_slice(&request(1, 2)[..5]);
        let mut rd = wire.as_slice();
        assert_eq!(read_hello(&mut rd).await.unwrap(), hello);
        let mut next = Vec::new();
        for _ in 0..3 {
            next.push(read_request(&mut rd, None).await.unwrap());
        }
        assert_eq!(
            next,
            [
                Incoming::Bytes {
                    offset: 4096,
                    len: 12
                },
                Incoming::Offer(b"abc".to_vec()),
                Incoming::End
            ]
        );
        // Another version's hello, and an offer past its bound, are refused.
        let mut other = hello.encode();
        other[4] = 2;
        assert!(read_hello(&mut other.as_slice()).await.is_err());
        let big = request(MAX_OFFER + 1, OFFER);
        assert!(read_request(&mut big.as_slice(), None).await.is_err());
    }

    #[tokio::test]
    async fn answers_longer_than_their_bound_are_refused_before_their_bytes_are_read() {
        let mut wire = head(0, u32::MAX);
        let e = read_answer(&mut wire.as_slice(), None, "s", "a", Want::AtMost(4096))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("more than 4096"), "{e}");
        wire = head(5, MAX_WHY + 1);
        let e = read_answer(&mut wire.as_slice(), None, "s", "a", Want::Exactly(1))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("a reason of 4097 bytes"), "{e}");
        wire = head(2, 2);
        wire.extend_from_slice(b"no");
        let e = read_verdict(&mut wire.as_slice(), "s", "a")
            .await
            .unwrap_err();
        assert_eq!((e.errno(), e.to_string()), (2, "s: no".to_string()));
    }
}
