//! GPU data: the `/kt/.gpu` control files' ioctl ABI ([`abi`]) and the tensor table a GPU key
//! carries ([`table`]). The control tree in the mount, the transfer worker and its transports
//! build on these (see `doc/gpu-abi.md`).

pub mod abi;
pub mod table;

/// The first key segment under which a mount shows GPU keys; no ordinary key may use it.
pub const CONTROL_DIR: &str = ".gpu";
