//! GPU data: the `/kt/.gpu` control files' ioctl ABI ([`abi`]), the tensor table a GPU key
//! carries ([`table`]), what the agent does for each control file ([`control`], with its part in
//! a window in [`window`]), and the transfer worker that moves the bytes ([`worker`], spoken to
//! over [`wire`]). See `doc/gpu-abi.md`.

pub mod abi;
pub mod control;
pub mod cuda;
pub mod table;
pub mod window;
pub mod wire;
pub mod worker;

/// The first path segment under which a mount shows GPU keys; no key may have it.
pub use crate::key::RESERVED as CONTROL_DIR;

/// 64 bits from the kernel's random source (never a guessable stand-in: ids made of these are
/// capabilities or names others must not predict).
pub(crate) fn random_u64() -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    // SAFETY: `b` is a valid buffer of its length.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(std::io::Error::last_os_error());
    }
    Ok(u64::from_ne_bytes(b))
}
