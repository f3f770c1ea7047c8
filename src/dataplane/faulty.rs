//! Peers that misbehave as a test chooses, in front of real ones: a peer that lies (a byte of
//! what it sends flipped, so a block does not match its hash) or dies mid-block (its stream
//! ends after so many bytes). What a fetch does then is tested without a peer process built to
//! lie, or killed at the right instant.
//!
//! ```text
//! let faulty = Arc::new(FaultyDial::new(Arc::new(Tcp)));
//! faulty.misbehave(&peer_addr, Misbehave::DieAfter(1000));
//! let peers = Peers::over(faulty.clone());
//! ```

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::peers::Dial;
use super::wire::{Peer, PeerStream, WireError};
use crate::locks::lock;

/// What a peer does wrong, counted in the bytes it sends on a connection.
#[derive(Clone, Copy, Debug)]
pub enum Misbehave {
    /// The byte at this offset is flipped.
    Lie(u64),
    /// The stream ends after this many bytes (the peer died).
    DieAfter(u64),
}

/// Dials through `inner`, and wraps every connection to an address a rule names.
pub struct FaultyDial {
    inner: Arc<dyn Dial>,
    rules: Mutex<Vec<(String, Misbehave)>>,
    dials: Mutex<Vec<String>>,
}

impl FaultyDial {
    pub fn new(inner: Arc<dyn Dial>) -> Self {
        FaultyDial {
            inner,
            rules: Mutex::default(),
            dials: Mutex::default(),
        }
    }

    /// Every connection made from now on to `target` misbehaves so: an address (`host:port`),
    /// or a host, for every port on it (a peer's port is often chosen by the system).
    pub fn misbehave(&self, target: &str, how: Misbehave) {
        lock(&self.rules).push((target.to_string(), how));
    }

    /// The addresses dialled so far, in order.
    pub fn dialled(&self) -> Vec<String> {
        lock(&self.dials).clone()
    }
}

#[async_trait::async_trait]
impl Dial for FaultyDial {
    async fn dial(&self, addr: &str, peer: Peer) -> Result<PeerStream, WireError> {
        lock(&self.dials).push(addr.to_string());
        let stream = self.inner.dial(addr, peer).await?;
        let how = lock(&self.rules)
            .iter()
            .rev()
            .find(|(target, _)| targets(target, addr))
            .map(|(_, how)| *how);
        Ok(match how {
            Some(how) => Box::new(Misbehaving {
                inner: stream,
                how,
                read: 0,
            }),
            None => stream,
        })
    }
}

/// Whether a rule naming `target` covers a connection to `addr`.
fn targets(target: &str, addr: &str) -> bool {
    target == addr
        || addr
            .rsplit_once(':')
            .is_some_and(|(host, _)| host.trim_matches(['[', ']']) == target)
}

/// A stream whose incoming bytes misbehave as `how` says.
struct Misbehaving {
    inner: PeerStream,
    how: Misbehave,
    /// Bytes received so far.
    read: u64,
}

impl AsyncRead for Misbehaving {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        if let Misbehave::DieAfter(n) = me.how {
            if me.read >= n {
                return Poll::Ready(Ok(()));
            }
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut me.inner).poll_read(cx, buf);
        if !matches!(polled, Poll::Ready(Ok(()))) {
            return polled;
        }
        let got = (buf.filled().len() - before) as u64;
        let start = me.read;
        me.read += got;
        match me.how {
            Misbehave::Lie(at) if (start..me.read).contains(&at) => {
                buf.filled_mut()[before + (at - start) as usize] ^= 0xff;
            }
            Misbehave::DieAfter(n) if me.read > n => {
                // What came past the end is not handed on: the peer died there.
                let keep = before + (n - start) as usize;
                buf.set_filled(keep);
                me.read = n;
            }
            _ => {}
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Misbehaving {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn wrapped(how: Misbehave) -> (Misbehaving, tokio::io::DuplexStream) {
        let (a, b) = tokio::io::duplex(1 << 16);
        let s = Misbehaving {
            inner: Box::new(a),
            how,
            read: 0,
        };
        (s, b)
    }

    #[test]
    fn a_rule_names_an_address_or_every_port_of_a_host() {
        assert!(targets("127.0.0.2:7448", "127.0.0.2:7448"));
        assert!(!targets("127.0.0.2:7448", "127.0.0.2:7449"));
        assert!(targets("127.0.0.2", "127.0.0.2:7449"));
        assert!(!targets("127.0.0.2", "127.0.0.21:7449"));
        assert!(targets("::1", "[::1]:80"));
    }

    #[tokio::test]
    async fn a_liar_flips_the_one_byte_and_a_dead_peer_ends_where_it_died() {
        let data: Vec<u8> = (0..200u8).collect();
        let (mut liar, mut far) = wrapped(Misbehave::Lie(150));
        far.write_all(&data).await.unwrap();
        drop(far);
        let mut got = Vec::new();
        liar.read_to_end(&mut got).await.unwrap();
        let mut want = data.clone();
        want[150] ^= 0xff;
        assert_eq!(got, want);

        let (mut dead, mut far) = wrapped(Misbehave::DieAfter(77));
        far.write_all(&data).await.unwrap();
        let mut got = Vec::new();
        // The far end stays open: the stream ends because the peer "died", not because it closed.
        dead.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, data[..77]);
    }
}
