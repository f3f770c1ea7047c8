//! GPU data: the `/kt/.gpu` control files' ioctl ABI ([`abi`]) and the tensor table a GPU key
//! carries ([`table`]). The control tree in the mount, the transfer worker and its transports
//! build on these (see `doc/gpu-abi.md`).

pub mod abi;
pub mod control;
pub mod cuda;
pub mod table;
pub mod wire;
pub mod worker;

/// The first path segment under which a mount shows GPU keys; no key may have it.
pub use crate::key::RESERVED as CONTROL_DIR;
