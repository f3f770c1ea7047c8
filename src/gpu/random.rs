//! The kernel's random source, for the ids of this module that others must not predict
//! (registrations, which are capabilities on the host transport, and scratch folders).

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
