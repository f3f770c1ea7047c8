//! A getter's side of pipelining: blocks being received are offered to peers through this
//! node's agent as each is verified, so a child in a broadcast tree need not wait for whole
//! files; and `--bwlimit`, which paces the same writes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::dataplane::fetch::{BlockJob, BlockSink};
use crate::dataplane::TransferError;
use crate::hash::subtree::Cv;
use crate::hash::Version;
use crate::locks::lock;
use crate::manifest::Manifest;
use crate::proto::{LocalFile, ReadyPieces, ReceiveEvent};
use crate::rpc::client::Agent;

/// Blocks being received, offered to peers through this node's agent as each is verified.
pub struct Offer {
    tx: mpsc::Sender<ReceiveEvent>,
    call: tokio::task::JoinHandle<()>,
}

impl Offer {
    /// Starts offering the blocks of `files` (entries of `m`, at absolute temporary paths).
    pub async fn open(
        agent: &mut Agent,
        version: Version,
        m: &Manifest,
        files: Vec<LocalFile>,
    ) -> Option<Offer> {
        let (tx, rx) = mpsc::channel(64);
        tx.send(ReceiveEvent {
            version: version.0.to_vec(),
            manifest: Some(m.clone()),
            files,
            ..Default::default()
        })
        .await
        .ok()?;
        let mut agent = agent.clone();
        let call = tokio::spawn(async move {
            let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
            if let Err(e) = agent.receive(stream).await {
                tracing::warn!(error = %e.message(), "the agent stopped serving blocks in flight");
            }
        });
        Some(Offer { tx, call })
    }

    /// A handle for announcing verified blocks from the sink's blocking threads.
    pub fn announcer(&self) -> mpsc::Sender<ReceiveEvent> {
        self.tx.clone()
    }

    /// Ends the offer; the agent serves from what was registered in the meantime.
    pub async fn close(self) {
        drop(self.tx);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.call).await;
    }
}

/// Writes blocks through another sink, then tells the agent that they are there, and keeps
/// to a byte rate if one is set.
pub struct Announcing {
    pub inner: Arc<dyn BlockSink>,
    pub tx: Option<mpsc::Sender<ReceiveEvent>>,
    pub limit: Option<RateLimit>,
}

impl Announcing {
    fn announce(&self, ev: ReceiveEvent) {
        if let Some(tx) = &self.tx {
            // The agent may be gone; the get goes on without serving others.
            let _ = tx.blocking_send(ev);
        }
    }

    fn announce_block(&self, job: &BlockJob) {
        self.announce(ReceiveEvent {
            ready: vec![job.hash.0.to_vec()],
            ..Default::default()
        });
    }

    /// Runs `write` of `len` bytes within the rate limit, if one is set. Under a limit blocks
    /// go out one at a time: the count stays locked from the write to the end of the pause
    /// that keeps the average under the limit.
    fn paced(
        &self,
        len: usize,
        write: impl FnOnce() -> Result<(), TransferError>,
    ) -> Result<(), TransferError> {
        let mut written = self.limit.as_ref().map(|l| lock(&l.written));
        write()?;
        if let (Some(l), Some(n)) = (&self.limit, written.as_deref_mut()) {
            *n += len as u64;
            l.pause(*n);
        }
        Ok(())
    }
}

impl BlockSink for Announcing {
    fn takes_pieces(&self) -> bool {
        self.inner.takes_pieces()
    }

    fn put_piece(&self, job: &BlockJob, data: &Bytes, cvs: &[Cv]) -> Result<(), TransferError> {
        self.paced(data.len(), || {
            self.inner.put_piece(job, data, cvs)?;
            if let Some(p) = job.piece {
                self.announce(ReceiveEvent {
                    pieces: vec![ReadyPieces {
                        block: job.hash.0.to_vec(),
                        log2: u32::from(p.log2),
                        cvs: cvs.concat(),
                        pieces: vec![p.index],
                    }],
                    ..Default::default()
                });
            }
            Ok(())
        })
    }

    fn pieces_done(&self, job: &BlockJob) -> Result<(), TransferError> {
        self.inner.pieces_done(job)?;
        self.announce_block(job);
        Ok(())
    }

    fn put(&self, job: &BlockJob, data: &Bytes) -> Result<(), TransferError> {
        self.paced(data.len(), || {
            self.inner.put(job, data)?;
            self.announce_block(job);
            Ok(())
        })
    }
}

/// `--bwlimit`: at most `bytes_per_sec` written on average since the start, as rsync does.
pub struct RateLimit {
    bytes_per_sec: u64,
    start: Instant,
    written: std::sync::Mutex<u64>,
}

impl RateLimit {
    pub fn new(bytes_per_sec: u64) -> Self {
        RateLimit {
            bytes_per_sec: bytes_per_sec.max(1),
            start: Instant::now(),
            written: std::sync::Mutex::new(0),
        }
    }

    /// Sleeps (on a blocking thread) until `written` bytes are due at the limit's rate.
    fn pause(&self, written: u64) {
        let due = Duration::from_secs_f64(written as f64 / self.bytes_per_sec as f64);
        let elapsed = self.start.elapsed();
        if due > elapsed {
            std::thread::sleep(due - elapsed);
        }
    }
}
