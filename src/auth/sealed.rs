//! Sealed frames of the host transport. A connection opens with a Noise handshake
//! (`Noise_NNpsk0_25519_AESGCM_SHA256`, by `snow`): both sides' ephemeral X25519 keys, mixed with
//! the registration's secret (`auth::gpu_secret`) as the pre-shared key, so only holders of the
//! secret complete it, each connection has keys of its own, and what was sealed stays sealed
//! even if the secret is later learnt (forward secrecy). Its split gives each direction an
//! AES-256-GCM key; each direction numbers its frames, a frame's number is its nonce (as in
//! Noise's transport), so no nonce repeats under a key, and a frame dropped, reordered or
//! replayed within the connection does not open. The frames are ours rather than Noise's
//! transport messages only because those stop at 64 KiB and a frame here carries 4 MiB.

use std::sync::Arc;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};

use crate::auth::gpu_secret::Secret;

/// Bytes a sealed frame carries beyond its plaintext.
pub const TAG: usize = 16;

const PATTERN: &str = "Noise_NNpsk0_25519_AESGCM_SHA256";

/// A handshake message's length: an ephemeral X25519 public key, and the tag of the empty
/// payload sealed under what the handshake knows so far.
pub const HANDSHAKE: usize = 32 + TAG;

/// A handshake message: the client's is in its hello, the server's follows its verdict.
pub type Hello = [u8; HANDSHAKE];

#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The other side does not hold the registration's secret (or the bytes were changed).
    #[error("the handshake does not open under the registration's secret")]
    Refused,
    #[error("the host transport's handshake: {0}")]
    Noise(String),
}

fn noise(e: snow::Error) -> HandshakeError {
    match e {
        snow::Error::Decrypt => HandshakeError::Refused,
        e => HandshakeError::Noise(e.to_string()),
    }
}

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

/// One side of a handshake under `secret`: the client's (`initiator`) or the server's.
fn handshake(secret: &Secret, initiator: bool) -> Result<snow::HandshakeState, HandshakeError> {
    let params: snow::params::NoiseParams = PATTERN.parse().map_err(noise)?;
    let b = snow::Builder::new(params).psk(0, secret).map_err(noise)?;
    match initiator {
        true => b.build_initiator(),
        false => b.build_responder(),
    }
    .map_err(noise)
}

/// The connection's keys once `hs` has finished: initiator to responder is to the server.
fn split(mut hs: snow::HandshakeState) -> Result<Keys, HandshakeError> {
    if !hs.is_handshake_finished() {
        return Err(HandshakeError::Noise("the handshake did not finish".into()));
    }
    let (to_server, to_client) = hs.dangerously_get_raw_split();
    let direction = |k: [u8; 32]| Direction {
        key: Arc::new(LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, &k).expect("an AES-256 key is 32 bytes"),
        )),
        next: 0,
    };
    Ok(Keys {
        to_server: direction(to_server),
        to_client: direction(to_client),
    })
}

/// The client's side of a handshake, between its hello and the server's answer.
pub struct Initiator(snow::HandshakeState);

impl Initiator {
    /// Starts a handshake under `secret`: the message the client's hello carries.
    pub fn start(secret: &Secret) -> Result<(Initiator, Hello), HandshakeError> {
        let mut hs = handshake(secret, true)?;
        let mut msg = [0u8; HANDSHAKE];
        let n = hs.write_message(&[], &mut msg).map_err(noise)?;
        if n != HANDSHAKE {
            return Err(HandshakeError::Noise(format!(
                "a first message of {n} bytes"
            )));
        }
        Ok((Initiator(hs), msg))
    }

    /// The connection's keys, from the server's answer; [`HandshakeError::Refused`] where the
    /// server does not hold the secret.
    pub fn finish(mut self, answer: &Hello) -> Result<Keys, HandshakeError> {
        let mut payload = [0u8; HANDSHAKE];
        self.0.read_message(answer, &mut payload).map_err(noise)?;
        split(self.0)
    }
}

/// The server's side of a handshake: from the client's message, the answer to send and the
/// connection's keys; [`HandshakeError::Refused`] where the client does not hold the secret.
pub fn respond(secret: &Secret, hello: &Hello) -> Result<(Hello, Keys), HandshakeError> {
    let mut hs = handshake(secret, false)?;
    let mut payload = [0u8; HANDSHAKE];
    hs.read_message(hello, &mut payload).map_err(noise)?;
    let mut msg = [0u8; HANDSHAKE];
    let n = hs.write_message(&[], &mut msg).map_err(noise)?;
    if n != HANDSHAKE {
        return Err(HandshakeError::Noise(format!("an answer of {n} bytes")));
    }
    Ok((msg, split(hs)?))
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

    fn connection(secret: &Secret) -> (Keys, Keys) {
        let (client, hello) = Initiator::start(secret).unwrap();
        let (answer, server) = respond(secret, &hello).unwrap();
        (client.finish(&answer).unwrap(), server)
    }

    #[test]
    fn a_frame_opens_once_in_its_place_and_under_its_connections_keys_only() {
        let s = [1u8; 32];
        let (mut a, mut b) = connection(&s);
        let mut one = b"first".to_vec();
        let mut two = b"second".to_vec();
        a.to_server.seal(&mut one);
        a.to_server.seal(&mut two);
        assert_eq!(one.len(), 5 + TAG);
        assert!(!one.windows(5).any(|w| w == b"first"), "sealed, not plain");
        // Out of order: the second does not open as the first.
        let mut swapped = two.clone();
        assert!(!b.to_server.clone().open(&mut swapped));
        assert!(b.to_server.open(&mut one) && one == b"first");
        assert!(b.to_server.open(&mut two) && two == b"second");
        // Both directions work, each under its own key.
        let mut back = b"back".to_vec();
        b.to_client.seal(&mut back);
        assert!(!a.to_server.clone().open(&mut back.clone()));
        assert!(a.to_client.open(&mut back) && back == b"back");
        // Another connection under the same secret has other keys (fresh ephemerals).
        let (mut c, _) = connection(&s);
        let mut x = b"x".to_vec();
        c.to_server.seal(&mut x);
        let (_, mut d) = connection(&s);
        assert!(!d.to_server.open(&mut x));
    }

    #[test]
    fn only_holders_of_the_secret_complete_the_handshake() {
        let (s, other) = ([1u8; 32], [2u8; 32]);
        // A client without the secret: the server refuses its hello.
        let (_, hello) = Initiator::start(&other).unwrap();
        assert!(matches!(respond(&s, &hello), Err(HandshakeError::Refused)));
        // A server without it: the client refuses its answer.
        let (client, hello) = Initiator::start(&s).unwrap();
        let (_, forged) = Initiator::start(&other).unwrap();
        assert!(respond(&other, &hello).is_err());
        assert!(client.finish(&forged).is_err());
        // A changed byte of the hello.
        let (_, mut hello) = Initiator::start(&s).unwrap();
        hello[40] ^= 1;
        assert!(matches!(respond(&s, &hello), Err(HandshakeError::Refused)));
    }
}
