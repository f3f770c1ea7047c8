//! The control plane as both ends see it: connections to the store server and to this node's
//! agent ([`client`]), the one table of failures across them ([`status`]), and the constants
//! and names both sides must agree on.

pub mod client;
pub mod error;
pub mod faulty;
pub mod gpu_window;
pub mod groups;
pub mod limits;
pub mod listing;
pub mod replicas;
pub mod status;
pub mod store;

pub use error::ClientError;
pub use groups::{default_gpu_group, default_group, implicit_group, scope_group};
pub use limits::{
    DEFAULT_FANOUT, DEFAULT_PORT, MAX_INLINE_BYTES, MAX_INLINE_FILE, MAX_RPC_MESSAGE,
    MISSING_BATCH, STORE,
};
pub use status::{Fault, RemoteError};
pub use store::{Store, StoreApi};
