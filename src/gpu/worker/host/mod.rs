//! The host transport: buffer bytes between workers over TCP, for CPU-only clusters, host
//! buffers and the tests.
//!
//! A connection is for one registration. It opens with a hello, `KTGH` and a version byte, the
//! registration (u64), whether the connection is sealed (u8) and the client's first Noise
//! handshake message (48 bytes; zeros unsealed), answered by a verdict `[errno u32][len u32]`
//! and, for an errno, a message saying why; a sealed connection's server then sends its
//! handshake answer (48 bytes). Then it carries pipelined
//! requests `[offset u64][len u32]` for bytes of the registration's run (its buffers in table
//! order, see [`Buffers`](super::memory::Buffers)), each answered in order by
//! `[errno u32][len u32]` and then the bytes, or, for an errno, the message. All integers are
//! little-endian. A request for bytes a receiving registration does not hold yet waits until
//! they arrive: that is what lets a chain or tree of workers forward a transfer while it is
//! still coming in. A request of [`frames::OFFER`] bytes is an NCCL offer instead, the last
//! request of its connection ([`p2p`](super::p2p)).
//!
//! Where the cluster issues secrets (a store server with authentication, see
//! `rpc::gpu_secret`), a registration is served only on sealed connections: every request and
//! answer travels as a frame sealed under the keys of a Noise NNpsk0 handshake whose pre-shared
//! key is the registration's secret (`auth::sealed`), so only a worker its agent gave the secret (from an answer of
//! the store server that checked the caller's namespace) is served, and what crosses the
//! network is ciphertext. Elsewhere a registration id is a random 64-bit number that only the
//! agent and the workers it told know.
//!
//! - [`frames`]: the hello, requests and answers, and the readers that decode them;
//! - [`conn`]: a getter's connection to a peer worker, past its hello;
//! - [`fetch`]: a GET's bytes, pipelined over one connection;
//! - [`serve`]: the serving end, which hands an NCCL offer to `p2p`.

pub mod conn;
pub mod fetch;
pub mod frames;
pub mod serve;
#[cfg(test)]
pub(crate) mod testing;
