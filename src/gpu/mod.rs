//! GPU data: the `/kt/.gpu` control files' ioctl ABI ([`abi`]), the tensor table a GPU key
//! carries ([`table`]), what the agent does for each control file ([`control`], with its part in
//! a window in [`window`]), and the transfer worker that moves the bytes ([`worker`], spoken to
//! over [`wire`]). See `doc/gpu-abi.md`.

pub mod abi;
pub mod control;
pub mod cuda;
mod random;
pub mod table;
pub mod window;
pub mod wire;
pub mod worker;

/// The first path segment under which a mount shows GPU keys; no key may have it.
pub use crate::key::RESERVED as CONTROL_DIR;
