//! What one connection to a source may have in flight: a byte budget in units of a semaphore,
//! shared by fetches and uploads.

/// Connections opened to one source at a time.
pub const CONNS_PER_SOURCE: usize = 2;
/// Bytes in flight on one connection: requested and not yet written to disk.
pub const WINDOW_BYTES: u32 = 16 << 20;
/// Semaphore unit for the byte budget.
pub const UNIT: u32 = 64 << 10;

pub fn permits(len: u32) -> u32 {
    len.div_ceil(UNIT).clamp(1, WINDOW_BYTES / UNIT)
}
