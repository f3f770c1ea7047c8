//! A GET's bytes over the host transport: the run cut into chunks, several requests in flight
//! on one connection, each chunk opened (where sealed) and written off the runtime's threads
//! while the next arrives.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

use super::conn::{connect, Conn, Source};
use super::frames::{self, peer_failed, read_answer, Want, OVERLAP};
use crate::gpu::worker::error::WorkerError;
use crate::gpu::worker::memory::Buffers;

/// Requests in flight on one connection.
const PIPELINE: usize = 8;
/// A source that sends nothing for this long is taken for dead.
pub const STALL: Duration = Duration::from_secs(60);

/// A received chunk being opened and written: whether it opened, and how the write went.
type Landing = tokio::task::JoinHandle<Result<bool, std::io::Error>>;

/// Fills `dst` from `src`, several requests in flight, chunks cut as [`Buffers::chunks`] says
/// for `pack`; sealed where the cluster issued a secret. Returns the bytes moved. On failure
/// `dst` fails too, so that whoever receives from it learns why.
pub async fn fetch(src: Source<'_>, dst: Arc<Buffers>, pack: bool) -> Result<u64, WorkerError> {
    let r = fetch_into(src, &dst, pack).await;
    if let Err(e) = &r {
        dst.fail(e.errno(), e.to_string());
    }
    r
}

async fn fetch_into(src: Source<'_>, dst: &Arc<Buffers>, pack: bool) -> Result<u64, WorkerError> {
    let Conn {
        mut rd,
        mut wr,
        mut sealer,
        mut opener,
    } = connect(src).await?;
    let Source {
        addr, name: source, ..
    } = src;
    let peer = |e: std::io::Error| peer_failed(source, addr, e);
    let chunks = dst.chunks(pack);
    let window = Arc::new(Semaphore::new(PIPELINE));
    let send = {
        let (window, chunks) = (window.clone(), chunks.clone());
        async move {
            for (at, len) in chunks {
                let Ok(permit) = window.acquire().await else {
                    break;
                };
                permit.forget();
                let mut req = frames::request(at, len);
                if let Some(s) = sealer.as_mut() {
                    s.seal(&mut req);
                }
                wr.write_all(&req).await?;
            }
            Ok::<_, std::io::Error>(wr)
        }
    };
    let receive = async {
        let mut moved = 0u64;
        // Chunks being opened and written, OVERLAP at most, in order: the buffers count as
        // filled up to the end of each only once every chunk before it is written.
        let mut landing: VecDeque<(u64, u32, Landing)> = VecDeque::new();
        let settle = |(at, len, task): (u64, u32, Landing)| async move {
            match task.await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    return Err(WorkerError::Peer(format!(
                        "{source} ({addr}) sent bytes that the registration's secret does not \
                         open"
                    )))
                }
                Ok(Err(e)) => return Err(WorkerError::from(e)),
                Err(e) => return Err(WorkerError::Bad(e.to_string())),
            }
            dst.filled(at + u64::from(len));
            Ok(u64::from(len))
        };
        for &(at, len) in &chunks {
            let got = tokio::time::timeout(
                STALL,
                read_answer(&mut rd, opener.as_mut(), source, addr, Want::Exactly(len)),
            )
            .await
            .unwrap_or_else(|_| {
                Err(WorkerError::Remote(
                    libc::ETIMEDOUT,
                    format!("{source} ({addr}) sent nothing for {} s", STALL.as_secs()),
                ))
            });
            window.add_permits(1);
            let mut data = match got {
                Ok(d) => d,
                Err(e) => {
                    window.close();
                    return Err(e);
                }
            };
            // Opened (when sealed) and written off the runtime's threads.
            let o = opener.as_mut().map(|o| (o.take(), o.clone()));
            let d = dst.clone();
            landing.push_back((
                at,
                len,
                tokio::task::spawn_blocking(move || {
                    if let Some((frame, o)) = o {
                        if !o.open_at(frame, &mut data) {
                            return Ok(false);
                        }
                    }
                    d.write(at, &data).map(|()| true)
                }),
            ));
            while landing.len() > OVERLAP {
                let Some(front) = landing.pop_front() else {
                    break;
                };
                match settle(front).await {
                    Ok(n) => moved += n,
                    Err(e) => {
                        window.close();
                        return Err(e);
                    }
                }
            }
        }
        while let Some(front) = landing.pop_front() {
            moved += settle(front).await?;
        }
        Ok::<u64, WorkerError>(moved)
    };
    let (sent, moved) = tokio::join!(send, receive);
    let moved = moved?;
    sent.map_err(peer)?;
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use test_support::pseudo_random;

    use super::*;
    use crate::gpu::worker::host::frames::CHUNK;
    use crate::gpu::worker::host::testing::*;
    use crate::locks::lock;

    #[tokio::test]
    async fn a_sealed_registration_goes_only_to_its_secrets_holder_and_as_ciphertext() {
        let dir = tempfile::tempdir().unwrap();
        let data = pseudo_random(2 * CHUNK as usize + 12345, 1);
        let secret = [3u8; 32];
        let src = buffers(dir.path(), "src", &data, false);
        let src = Arc::new(Arc::into_inner(src).unwrap().sealed_by(Some(secret)));

        let (addr, seen) = served_through_relay(src.clone(), None).await;
        let dst = buffers(dir.path(), "dst", &vec![0; data.len()], true);
        let moved = fetch(at(&addr, Some(secret)), dst.clone(), true).await;
        assert_eq!(moved.unwrap(), data.len() as u64);
        assert!(dst.read(0, data.len()).unwrap() == data, "the bytes differ");
        let wire = lock(&seen).clone();
        assert!(wire.len() > data.len(), "{} bytes relayed", wire.len());
        assert!(!shows(&wire, &data), "plaintext crossed the wire");

        // Another secret is not served a byte, nor is a worker without one.
        for (given, says) in [(Some([4u8; 32]), "does not open"), (None, "served sealed")] {
            let (addr, _) = served_through_relay(src.clone(), None).await;
            let dst = buffers(dir.path(), "dst2", &vec![0; data.len()], true);
            let e = fetch(at(&addr, given), dst.clone(), true)
                .await
                .unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
            assert!(dst.read(0, 64).unwrap().iter().all(|&b| b == 0));
        }
    }

    #[tokio::test]
    async fn without_secrets_the_registration_id_reaches_the_bytes_in_the_clear() {
        let dir = tempfile::tempdir().unwrap();
        let data = pseudo_random(CHUNK as usize + 999, 2);
        let (addr, seen) =
            served_through_relay(buffers(dir.path(), "src", &data, false), None).await;
        let dst = buffers(dir.path(), "dst", &vec![0; data.len()], true);
        fetch(at(&addr, None), dst.clone(), false).await.unwrap();
        assert!(dst.read(0, data.len()).unwrap() == data);
        // What the sealed test's check would have caught.
        assert!(shows(&lock(&seen), &data));
        // A secret for a registration that has none is refused, not ignored.
        let (addr, _) = served_through_relay(buffers(dir.path(), "src2", &data, false), None).await;
        let e = fetch(at(&addr, Some([1; 32])), dst, false)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("has no secret"), "{e}");
    }
}
