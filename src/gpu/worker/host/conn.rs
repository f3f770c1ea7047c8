//! A getter's connection to a peer worker for one registration: the hello and its verdict, the
//! keys where the registration is sealed, then requests out and answers in (an NCCL offer's
//! among them, see [`p2p`](crate::gpu::worker::p2p)).

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::frames::{self, peer_failed, read_answer, read_verdict, Hello, Want, OFFER};
use crate::auth::gpu_secret::Secret;
use crate::auth::sealed::{self, Direction};
use crate::gpu::worker::error::WorkerError;

/// The registration a GET pulls from.
#[derive(Clone, Copy)]
pub struct Source<'a> {
    /// Its worker's data address.
    pub addr: &'a str,
    pub registration: u64,
    /// Its secret, where the cluster issues them.
    pub secret: Option<Secret>,
    /// Who that is, for messages.
    pub name: &'a str,
}

/// A connection to a peer worker for one registration, past its hello: sealed, where there is a
/// secret, under keys for each direction.
pub struct Conn {
    pub rd: BufReader<OwnedReadHalf>,
    pub wr: OwnedWriteHalf,
    pub sealer: Option<Direction>,
    pub opener: Option<Direction>,
}

/// Connects to `src`'s worker for its registration.
pub async fn connect(src: Source<'_>) -> Result<Conn, WorkerError> {
    let Source {
        addr,
        registration,
        secret,
        name: source,
    } = src;
    let peer = |e: std::io::Error| peer_failed(source, addr, e);
    let stream = TcpStream::connect(addr).await.map_err(peer)?;
    stream.set_nodelay(true)?;
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(1 << 20, rd);
    let handshake = secret
        .map(|s| sealed::Initiator::start(&s))
        .transpose()
        .map_err(|e| WorkerError::Bad(e.to_string()))?;
    let hello = Hello {
        registration,
        sealed: handshake.is_some(),
        fresh: handshake
            .as_ref()
            .map_or([0u8; sealed::HANDSHAKE], |(_, m)| *m),
    };
    wr.write_all(&hello.encode()).await.map_err(peer)?;
    read_verdict(&mut rd, source, addr).await?;
    let keys = match handshake {
        Some((client, _)) => {
            let mut answer = [0u8; sealed::HANDSHAKE];
            rd.read_exact(&mut answer).await.map_err(peer)?;
            let k = client.finish(&answer).map_err(|e| {
                WorkerError::Peer(format!(
                    "{source} ({addr}) does not hold the registration's secret: {e}"
                ))
            })?;
            Some((k.to_server, k.to_client))
        }
        None => None,
    };
    let (sealer, opener) = keys.unzip();
    Ok(Conn {
        rd,
        wr,
        sealer,
        opener,
    })
}

impl Conn {
    /// Sends an NCCL offer: a request of [`OFFER`] bytes whose offset says the body's length,
    /// then the body.
    pub async fn send_offer(&mut self, body: Vec<u8>) -> std::io::Result<()> {
        let mut req = frames::request(body.len() as u64, OFFER);
        let mut body = body;
        if let Some(s) = self.sealer.as_mut() {
            s.seal(&mut req);
            s.seal(&mut body);
        }
        self.wr.write_all(&req).await?;
        self.wr.write_all(&body).await
    }

    /// The next answer, of at most `max` bytes, opened: an errno it carries is an error.
    pub async fn receive(
        &mut self,
        max: u32,
        source: &str,
        addr: &str,
    ) -> Result<Vec<u8>, WorkerError> {
        let mut data = read_answer(
            &mut self.rd,
            self.opener.as_mut(),
            source,
            addr,
            Want::AtMost(max),
        )
        .await?;
        if let Some(o) = self.opener.as_mut() {
            if !o.open(&mut data) {
                return Err(WorkerError::Peer(format!(
                    "{source} ({addr}) answered under keys the registration's secret does not \
                     open"
                )));
            }
        }
        Ok(data)
    }
}
