//! The transfer worker: the process that holds a caller's buffers and moves their bytes, in the
//! caller's namespaces (where the caller is not in the agent's, the agent starts it there; see
//! [`spawn`]). It takes requests from its agent over its control socket ([`requests`]: register
//! buffers, fill buffers from another worker, let go of a registration), serves the bytes of
//! what is registered on its data port ([`host`]), and exits when its agent closes the control
//! socket.
//!
//! From the bottom up: [`error`]; the buffers of a registration ([`memory`], CUDA ones through
//! [`cuda_buffer`]); the host transport's frames, a getter's connection and its GETs
//! ([`host`]); NCCL's kept communicators ([`comms`]), a transfer's [`stop`], a fanout's
//! [`tree`] and a window's broadcast ([`collective`]); a GET between two workers over NCCL,
//! offered on the host transport's connection ([`p2p`]); the host transport's serving end,
//! which hands offers to `p2p` ([`host::serve`]); and the agent's requests on top.

pub mod collective;
pub mod comms;
pub mod cuda_buffer;
pub mod enter;
pub mod error;
pub mod host;
pub mod memory;
pub mod p2p;
pub mod requests;
pub mod spawn;
pub mod stop;
pub mod tree;

pub use error::WorkerError;
pub use requests::run;
