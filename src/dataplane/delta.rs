//! rsync deltas of a block against the block it replaces (`fast_rsync`, librsync's formats).
//!
//! The side that holds the old block sends its [`signature`]; the side with the new block
//! answers with a [`diff`] against it; the holder rebuilds the new block with [`apply`]. The
//! signature's hashes are MD4 cut short, so a delta is never trusted: whoever rebuilds a block
//! checks it against its blake3 hash before keeping it. Deltas are librsync's own format, so
//! `rdiff patch` applies them.

use fast_rsync::{IndexedSignature, Signature, SignatureOptions};

/// Bytes of MD4 kept per signature window. A false match costs a refused delta and a plain
/// upload, never a wrong block (the rebuilt block is checked against its hash).
const CRYPTO_HASH_BYTES: u32 = 8;
/// Window sizes of a signature: rsync's square root of the length, within these bounds.
const MIN_WINDOW: u32 = 2048;
const MAX_WINDOW: u32 = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    #[error("malformed rsync signature")]
    BadSignature,
    #[error("cannot make a delta: {0}")]
    Diff(String),
    #[error("the delta does not apply: {0}")]
    Apply(String),
}

/// The window a signature of `len` bytes uses: the square root of the length, as rsync picks
/// it, so a signature grows with the square root of the block.
fn window(len: usize) -> u32 {
    let root = (len as f64).sqrt() as u32;
    root.clamp(MIN_WINDOW, MAX_WINDOW) & !7
}

/// The rsync signature of `base`: what the holder of an old block sends to whoever has its
/// replacement.
pub fn signature(base: &[u8]) -> Vec<u8> {
    Signature::calculate(
        base,
        SignatureOptions {
            block_size: window(base.len()),
            crypto_hash_size: CRYPTO_HASH_BYTES,
        },
    )
    .into_serialized()
}

/// A delta that turns the block `sig` describes into `data`.
pub fn diff(sig: &[u8], data: &[u8]) -> Result<Vec<u8>, DeltaError> {
    let sig = Signature::deserialize(sig.to_vec()).map_err(|_| DeltaError::BadSignature)?;
    let indexed: IndexedSignature<'_> = sig.index();
    let mut out = Vec::new();
    fast_rsync::diff(&indexed, data, &mut out).map_err(|e| DeltaError::Diff(e.to_string()))?;
    Ok(out)
}

/// `base` with `delta` applied, refused if it would grow past `limit` bytes.
pub fn apply(base: &[u8], delta: &[u8], limit: usize) -> Result<Vec<u8>, DeltaError> {
    let mut out = Vec::new();
    fast_rsync::apply_limited(base, delta, &mut out, limit)
        .map_err(|e| DeltaError::Apply(e.to_string()))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delta_against_a_similar_block_is_small_and_rebuilds_it() {
        let old: Vec<u8> = (0..(1u32 << 20))
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut new = old[..500_000].to_vec();
        new.extend_from_slice(b"an inserted line\n");
        new.extend_from_slice(&old[500_000..]);
        let sig = signature(&old);
        let delta = diff(&sig, &new).unwrap();
        assert!(delta.len() < 4096, "delta of {} bytes", delta.len());
        assert_eq!(apply(&old, &delta, new.len()).unwrap(), new);
        // Past its limit, or from garbage, nothing is rebuilt.
        assert!(apply(&old, &delta, new.len() - 1).is_err());
        assert!(apply(&old, b"not a delta", 1 << 20).is_err());
        assert!(matches!(diff(b"junk", &new), Err(DeltaError::BadSignature)));
    }
}
