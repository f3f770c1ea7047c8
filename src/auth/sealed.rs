//! Sealed frames of the host transport: AES-256-GCM, under keys drawn from the registration's
//! secret (`rpc::gpu_secret`) and a fresh nonce from each side, so every connection has keys
//! of its own and nothing sealed on one can be replayed on another. Each direction has its own
//! key and numbers its frames; a frame's number is its nonce, so no nonce repeats under a key,
//! and a frame dropped, reordered or replayed within the connection does not open.

use std::sync::Arc;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

use crate::auth::gpu_secret::Secret;

/// Bytes a sealed frame carries beyond its plaintext.
pub const TAG: usize = 16;

/// A hello's fresh value.
pub type Hello = [u8; 32];

const TO_SERVER: &str = "ktfs 2026-12 GPU host transport, client to server";
const TO_CLIENT: &str = "ktfs 2026-12 GPU host transport, server to client";

/// One direction of a connection: its key and the number of its next frame. A clone shares
/// the key, so that frames numbered ahead ([`Direction::seal_at`]) are sealed on other threads.
#[derive(Clone)]
pub struct Direction {
    key: Arc<LessSafeKey>,
    next: u64,
}

/// Both directions' keys of one connection.
pub struct Keys {
    pub to_server: Direction,
    pub to_client: Direction,
}

/// A fresh hello value from the system's random source.
pub fn hello() -> std::io::Result<Hello> {
    let mut h = [0u8; 32];
    SystemRandom::new()
        .fill(&mut h)
        .map_err(|_| std::io::Error::other("no randomness for a host transport hello"))?;
    Ok(h)
}

/// The keys of a connection whose client said `client` and server `server`.
pub fn keys(secret: &Secret, client: &Hello, server: &Hello) -> Keys {
    let mut material = Vec::with_capacity(96);
    material.extend_from_slice(secret);
    material.extend_from_slice(client);
    material.extend_from_slice(server);
    let direction = |context: &str| Direction {
        key: Arc::new(LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, &blake3::derive_key(context, &material))
                .expect("an AES-256 key is 32 bytes"),
        )),
        next: 0,
    };
    Keys {
        to_server: direction(TO_SERVER),
        to_client: direction(TO_CLIENT),
    }
}

fn nonce(frame: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[..8].copy_from_slice(&frame.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

impl Direction {
    /// The number of the next frame, which is then taken: a caller that seals or opens frames
    /// out of turn ([`Direction::seal_at`], [`Direction::open_at`]) takes their numbers first.
    pub fn take(&mut self) -> u64 {
        self.next += 1;
        self.next - 1
    }

    /// Seals `data` in place as this direction's next frame (its tag appended).
    pub fn seal(&mut self, data: &mut Vec<u8>) {
        let frame = self.take();
        self.seal_at(frame, data);
    }

    /// Seals `data` in place as frame `frame` (taken with [`Direction::take`]).
    pub fn seal_at(&self, frame: u64, data: &mut Vec<u8>) {
        self.key
            .seal_in_place_append_tag(nonce(frame), Aad::empty(), data)
            .expect("frames are far below AES-GCM's limit");
    }

    /// Opens `data` in place as this direction's next frame (its tag removed); false where it
    /// was not sealed under this key as that frame.
    #[must_use]
    pub fn open(&mut self, data: &mut Vec<u8>) -> bool {
        let frame = self.take();
        self.open_at(frame, data)
    }

    /// [`Direction::open`] as frame `frame` (taken with [`Direction::take`]).
    #[must_use]
    pub fn open_at(&self, frame: u64, data: &mut Vec<u8>) -> bool {
        match self.key.open_in_place(nonce(frame), Aad::empty(), data) {
            Ok(plain) => {
                let n = plain.len();
                data.truncate(n);
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_opens_once_in_its_place_and_under_its_keys_only() {
        let (s, c, v) = ([1u8; 32], [2u8; 32], [3u8; 32]);
        let (mut a, mut b) = (keys(&s, &c, &v), keys(&s, &c, &v));
        let mut one = b"first".to_vec();
        let mut two = b"second".to_vec();
        a.to_server.seal(&mut one);
        a.to_server.seal(&mut two);
        assert_eq!(one.len(), 5 + TAG);
        assert!(!one.windows(5).any(|w| w == b"first"), "sealed, not plain");
        // Out of order: the second does not open as the first.
        let mut swapped = two.clone();
        assert!(!b.to_server.open(&mut swapped));
        let mut b = keys(&s, &c, &v);
        assert!(b.to_server.open(&mut one) && one == b"first");
        assert!(b.to_server.open(&mut two) && two == b"second");
        // Not the other direction's, nor another connection's, nor a changed byte.
        let mut x = b"x".to_vec();
        keys(&s, &c, &v).to_client.seal(&mut x);
        assert!(!keys(&s, &c, &v).to_server.open(&mut x.clone()));
        assert!(!keys(&s, &c, &[4u8; 32]).to_client.open(&mut x.clone()));
        assert!(!keys(&[9u8; 32], &c, &v).to_client.open(&mut x.clone()));
        x[0] ^= 1;
        assert!(!keys(&s, &c, &v).to_client.open(&mut x));
    }
}
