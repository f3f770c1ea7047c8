//! Messages between the agent and a transfer worker: a little-endian `u32` length, then the
//! encoded message, with a size limit on what is read.

use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest control message (a registration of a state dict with very many entries).
pub const MAX_MESSAGE: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("worker connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("a worker message of {0} bytes is over the limit")]
    TooLarge(usize),
    #[error("a malformed worker message: {0}")]
    Decode(#[from] prost::DecodeError),
}

pub async fn send<W: AsyncWrite + Unpin>(w: &mut W, m: &impl Message) -> Result<(), WireError> {
    let body = m.encode_to_vec();
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    w.write_all(&frame).await?;
    w.flush().await?;
    Ok(())
}

/// The next message, or `None` when the peer closed the connection between messages.
pub async fn recv<R: AsyncRead + Unpin, M: Message + Default>(
    r: &mut R,
) -> Result<Option<M>, WireError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(WireError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(Some(M::decode(body.as_slice())?))
}
