//! The serving end of the host transport: each connection's hello admitted (or refused), its
//! requests for bytes answered in order as the bytes are there, and an NCCL offer handed to
//! [`p2p`](crate::gpu::worker::p2p), which answers it and may then move the bytes itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::frames::{head, read_hello, read_request, Incoming, CHUNK, OVERLAP};
use crate::auth::gpu_secret::Secret;
use crate::auth::sealed::{self, Direction};
use crate::gpu::worker::error::WorkerError;
use crate::gpu::worker::memory::Buffers;
use crate::gpu::worker::p2p::{self, Lane};
use crate::gpu::worker::stop::Stop;
use crate::locks::lock;

/// Registrations this worker serves, by id.
pub type Served = Arc<Mutex<HashMap<u64, Arc<Buffers>>>>;

/// An answer being made: its head and body, sealed where the connection is (none: nothing to
/// send after all).
type Answer = tokio::task::JoinHandle<Result<Option<(Vec<u8>, Vec<u8>)>, WorkerError>>;

/// Where the connection is sealed, the direction answers are sealed in and the numbers of the
/// frames of one answer (its head's, its body's), taken in the order the answers go out.
type Frames = Option<(Direction, (u64, u64))>;

/// Serves `served` on `listener` until the process ends; `lane`, where this worker can move
/// CUDA bytes over NCCL, answers a getter's offer to take them that way.
pub async fn serve(listener: TcpListener, served: Served, lane: Option<Arc<dyn Lane>>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (served, lane) = (served.clone(), lane.clone());
        tokio::spawn(async move {
            if let Err(e) = serve_connection(stream, served, lane).await {
                tracing::debug!(error = %e, "host transport connection ended");
            }
        });
    }
}

/// The registration a hello asks for, if this connection may have its bytes.
fn admit(
    served: &Served,
    registration: u64,
    sealed: bool,
) -> Result<(Arc<Buffers>, Option<Secret>), (i32, String)> {
    let b = lock(served)
        .get(&registration)
        .cloned()
        .ok_or((libc::ENOENT, format!("no registration {registration} here")))?;
    let secret = b.secret().copied();
    match (secret.is_some(), sealed) {
        (true, false) => Err((
            libc::EACCES,
            format!(
                "registration {registration} is served sealed, to workers given its secret by \
                 the store server; this one has none"
            ),
        )),
        (false, true) => Err((
            libc::EPROTO,
            format!(
                "registration {registration} has no secret here: its node's agent has no key \
                 from the store server"
            ),
        )),
        _ => Ok((b, secret)),
    }
}

/// What a connection admitted serves: the registration's id and buffers, and where it is
/// sealed the opener of its requests and the sealer of its answers.
struct Admitted {
    registration: u64,
    buffers: Arc<Buffers>,
    keys: Option<(Direction, Direction)>,
}

/// The hello read and answered: the verdict, and a sealed connection's handshake answer. `None`
/// where it was refused (the refusal sent), a sealed hello that does not open under the
/// registration's secret included.
async fn greet<R: AsyncRead + Unpin>(
    rd: &mut R,
    wr: &mut OwnedWriteHalf,
    served: &Served,
) -> Result<Option<Admitted>, WorkerError> {
    let hello = read_hello(rd).await?;
    let admitted = admit(served, hello.registration, hello.sealed).and_then(|(b, secret)| {
        // Only a holder of the registration's secret completes the handshake.
        match secret {
            Some(s) => match sealed::respond(&s, &hello.fresh) {
                Ok((answer, k)) => Ok((b, Some((answer, k)))),
                Err(e) => Err((libc::EACCES, e.to_string())),
            },
            None => Ok((b, None)),
        }
    });
    let (buffers, handshake) = match admitted {
        Ok(x) => x,
        Err((errno, why)) => {
            let mut refusal = head(errno as u32, why.len() as u32);
            refusal.extend_from_slice(why.as_bytes());
            wr.write_all(&refusal).await?;
            return Ok(None);
        }
    };
    wr.write_all(&head(0, 0)).await?;
    let keys = match handshake {
        Some((answer, k)) => {
            wr.write_all(&answer).await?;
            Some((k.to_server, k.to_client))
        }
        None => None,
    };
    Ok(Some(Admitted {
        registration: hello.registration,
        buffers,
        keys,
    }))
}

async fn serve_connection(
    stream: TcpStream,
    served: Served,
    lane: Option<Arc<dyn Lane>>,
) -> Result<(), WorkerError> {
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let Some(Admitted {
        registration,
        buffers: b,
        keys,
    }) = greet(&mut rd, &mut wr, &served).await?
    else {
        return Ok(());
    };
    let (mut opener, mut sealer) = keys.unzip();
    // Answers are made (read, and sealed) OVERLAP at a time on tasks of their own, so that one
    // chunk's sealing overlaps the next one's read, and written in the order asked.
    let (tx, rx) = mpsc::channel::<Answer>(OVERLAP);
    let reader = async move {
        loop {
            match read_request(&mut rd, opener.as_mut()).await? {
                Incoming::End => return Ok(()),
                Incoming::Bytes { offset, len } => {
                    let frames = next_frames(sealer.as_mut());
                    if tx
                        .send(make_answer(b.clone(), offset, len, frames))
                        .await
                        .is_err()
                    {
                        return Ok(());
                    }
                }
                Incoming::Offer(body) => {
                    // The last request on this connection: the NCCL transfer that may follow
                    // ends it, and the connection's end (the getter done, or gone) stops that
                    // transfer.
                    let offer = Offer {
                        b: b.clone(),
                        body,
                        lane: lane.clone(),
                        // The answer goes out as the frames taken for this request; the
                        // verdict after it.
                        answer_frames: next_frames(sealer.as_mut()),
                        verdict_frames: next_frames(sealer.as_mut()),
                    };
                    return offer.answer_then_end(&mut rd, tx).await;
                }
                Incoming::Unopened => {
                    // Answered under this side's keys, which the caller's do not open: it
                    // learns that the secrets differ, not that the connection broke.
                    let why = format!(
                        "a request that registration {registration}'s secret does not open"
                    );
                    let refusal = seal(
                        next_frames(sealer.as_mut()),
                        head(libc::EACCES as u32, why.len() as u32),
                        why.clone().into_bytes(),
                    );
                    let _ = tx
                        .send(tokio::spawn(async move { Ok(Some(refusal)) }))
                        .await;
                    return Err(WorkerError::Bad(why));
                }
            }
        }
    };
    let (read, written) = tokio::join!(reader, write_answers(wr, rx));
    written?;
    read
}

/// Writes the answers `rx` hands over, in order, each once it is made.
async fn write_answers(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Answer>,
) -> Result<(), WorkerError> {
    while let Some(answer) = rx.recv().await {
        let made = answer
            .await
            .map_err(|e| WorkerError::Bad(e.to_string()))??;
        if let Some((h, body)) = made {
            wr.write_all(&h).await?;
            wr.write_all(&body).await?;
        }
    }
    Ok(())
}

/// The frames of the next answer, where the connection is sealed.
fn next_frames(sealer: Option<&mut Direction>) -> Frames {
    sealer.map(|d| (d.clone(), (d.take(), d.take())))
}

/// `head` and `body` sealed as the frames given (the head's, the body's), or as they are.
fn seal(frames: Frames, mut h: Vec<u8>, mut body: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
    if let Some((d, (hf, bf))) = frames {
        d.seal_at(hf, &mut h);
        d.seal_at(bf, &mut body);
    }
    (h, body)
}

/// The answer to a request for `len` bytes at `offset` of `b`, made on a task of its own.
fn make_answer(b: Arc<Buffers>, offset: u64, len: u32, frames: Frames) -> Answer {
    tokio::spawn(async move {
        let (errno, body) = match answer(&b, offset, len).await {
            Ok(d) => (0u32, d),
            Err((e, why)) => (e as u32, why.into_bytes()),
        };
        let h = head(errno, body.len() as u32);
        match frames {
            None => Ok(Some((h, body))),
            // Off the runtime's threads: a chunk's sealing takes a millisecond or so.
            frames => tokio::task::spawn_blocking(move || Some(seal(frames, h, body)))
                .await
                .map_err(|e| WorkerError::Bad(e.to_string())),
        }
    })
}

/// The bytes a request asks for, once they are there.
async fn answer(b: &Arc<Buffers>, offset: u64, len: u32) -> Result<Vec<u8>, (i32, String)> {
    let end = offset
        .checked_add(u64::from(len))
        .filter(|&e| u64::from(len) <= CHUNK && e <= b.nbytes())
        .ok_or((
            libc::EINVAL,
            format!("{len} bytes at {offset} are not within the registration"),
        ))?;
    b.wait_filled(end).await?;
    let b = b.clone();
    tokio::task::spawn_blocking(move || b.read(offset, len as usize))
        .await
        .map_err(|e| (libc::EIO, e.to_string()))?
        .map_err(|e| (e.raw_os_error().unwrap_or(libc::EIO), e.to_string()))
}

/// An NCCL offer a connection carried, with the frames its answer and then its verdict go out
/// as.
struct Offer {
    b: Arc<Buffers>,
    body: Vec<u8>,
    lane: Option<Arc<dyn Lane>>,
    answer_frames: Frames,
    verdict_frames: Frames,
}

impl Offer {
    /// Hands the offer to [`p2p::answer_offer`], sends its answer and verdict as they come,
    /// and stops the transfer once the getter's end of the connection closes.
    async fn answer_then_end<R: AsyncRead + Unpin>(
        self,
        rd: &mut R,
        tx: mpsc::Sender<Answer>,
    ) -> Result<(), WorkerError> {
        let Offer {
            b,
            body,
            lane,
            answer_frames,
            verdict_frames,
        } = self;
        let stop = Arc::new(Stop::default());
        let (answer, verdict) = p2p::answer_offer(b, body, lane, stop.clone());
        let answer = tokio::spawn(async move {
            Ok(answer
                .await
                .ok()
                .map(|(h, body)| seal(answer_frames, h, body)))
        });
        let verdict = tokio::spawn(async move {
            let made = verdict.await.ok().flatten();
            Ok(made.map(|(h, body)| seal(verdict_frames, h, body)))
        });
        if tx.send(answer).await.is_err() || tx.send(verdict).await.is_err() {
            stop.stop_in_background();
            return Ok(());
        }
        drop(tx);
        let mut rest = [0u8; 64];
        while let Ok(1..) = rd.read(&mut rest).await {}
        stop.stop_in_background();
        Ok(())
    }
}
