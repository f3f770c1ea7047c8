//! Pieces of blocks on the data plane: `OP_GET_PIECE` asks a peer for piece `i` of a block cut
//! into pieces of `2^k` bytes; the answer carries the block's chaining values (one per piece,
//! `hash::subtree`) and the piece's bytes, so the asker checks the values against the block's
//! hash and the bytes against their value before it keeps or forwards a byte. The values come
//! with every piece (32 bytes a piece of the block: 256 bytes for a 4 MiB block in 512 KiB
//! pieces) so that any holder can be asked for any piece, in any order, with no state between
//! requests.
//!
//! A peer serves a piece from a block it holds whole. It computes the block's values once and
//! keeps the latest few ([`CVS_BUDGET`] bytes of them), so that serving every piece of a
//! block hashes it once, and reads only the piece's range of a block it keeps in a file.

use std::collections::VecDeque;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::blocks::{BlockServe, Served};
use crate::hash::subtree::{Cut, Cv, Piece};
use crate::hash::BlockHash;
use crate::locks::lock;
use crate::manifest::MAX_BLOCK_SIZE;

/// Smallest piece asked for on the wire.
pub const MIN_PIECE_LOG2: u8 = crate::hash::subtree::MIN_SWARM_PIECE_LOG2;
/// Largest piece: half the largest block (a whole block goes as a block).
pub const MAX_PIECE_LOG2: u8 = MAX_BLOCK_SIZE.trailing_zeros() as u8 - 1;
/// Bytes of chaining values a peer keeps for the blocks it served pieces of last.
const CVS_BUDGET: usize = 4 << 20;

/// The cut of a block of `len` bytes into pieces of `2^size_log2`, within the wire's bounds.
pub fn cut(len: u64, size_log2: u8) -> Option<Cut> {
    if !(MIN_PIECE_LOG2..=MAX_PIECE_LOG2).contains(&size_log2) {
        return None;
    }
    Cut::new(len, 1u64 << size_log2)
}

/// A block's length and values, by its hash and the piece size they were cut for.
type KeptCvs = ((BlockHash, u8), Arc<Values>);

struct Values {
    len: u64,
    cvs: Vec<Cv>,
}

#[derive(Default)]
struct Kept {
    entries: VecDeque<KeptCvs>,
    bytes: usize,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    entries: VecDeque::new(),
    bytes: 0,
});

fn kept(hash: &BlockHash, size_log2: u8) -> Option<Arc<Values>> {
    let k = lock(&KEPT);
    k.entries
        .iter()
        .find(|(key, _)| *key == (*hash, size_log2))
        .map(|(_, v)| v.clone())
}

fn keep(hash: BlockHash, size_log2: u8, cvs: Arc<Values>) {
    let mut k = lock(&KEPT);
    if k.entries.iter().any(|(key, _)| *key == (hash, size_log2)) {
        return;
    }
    k.bytes += 32 * cvs.cvs.len();
    k.entries.push_back(((hash, size_log2), cvs));
    while k.bytes > CVS_BUDGET {
        match k.entries.pop_front() {
            Some((_, old)) => k.bytes -= 32 * old.cvs.len(),
            None => break,
        }
    }
}

/// Why a piece could not be served.
#[derive(Debug)]
pub enum PieceError {
    /// This peer does not hold the block.
    NotHere,
    Bad(String),
}

/// Piece `index` of block `hash` cut in pieces of `2^size_log2`, from the block as `svc` holds
/// it. Blocks on the disk: call it off the async threads.
pub fn serve(
    svc: &dyn BlockServe,
    hash: &BlockHash,
    size_log2: u8,
    index: u32,
) -> Result<Piece, PieceError> {
    // A block received in pieces here is served piece by piece (whole or not yet), reading and
    // checking the piece alone; any other, from the block whole.
    if let Some(p) = svc
        .piece(hash, size_log2, index)
        .map_err(|e| PieceError::Bad(e.to_string()))?
    {
        return Ok(p);
    }
    // A block held whole whose values are kept: the piece's bytes alone, where they can be
    // read alone, checked against their value.
    let known = kept(hash, size_log2);
    if let Some(v) = &known {
        if let Some(p) = from_range(svc, hash, size_log2, index, v)? {
            return Ok(p);
        }
    }
    let served = svc
        .get(hash)
        .map_err(|e| PieceError::Bad(e.to_string()))?
        .ok_or(PieceError::NotHere)?;
    let len = match &served {
        Served::Bytes(b) => b.len() as u64,
        Served::File(_, len) => *len,
    };
    if len > u64::from(MAX_BLOCK_SIZE) {
        return Err(PieceError::Bad(format!(
            "block {hash} is stored with {len} bytes, over the limit"
        )));
    }
    let cut = cut(len, size_log2)
        .ok_or_else(|| PieceError::Bad(format!("no pieces of 2^{size_log2} bytes")))?;
    let range = cut.range(index).ok_or_else(|| {
        PieceError::Bad(format!(
            "block {hash} has {} pieces of 2^{size_log2} bytes, not {}",
            cut.count(),
            index + 1
        ))
    })?;
    let whole = |served: &Served| -> Result<Bytes, PieceError> {
        match served {
            Served::Bytes(b) => Ok(b.clone()),
            Served::File(f, len) => {
                let mut v = vec![0u8; *len as usize];
                f.read_exact_at(&mut v, 0)
                    .map_err(|e| PieceError::Bad(format!("reading block {hash}: {e}")))?;
                Ok(Bytes::from(v))
            }
        }
    };
    let (start, end) = (range.start as usize, range.end as usize);
    let (cvs, data) = match known.filter(|v| v.len == len) {
        Some(v) => {
            let data = match &served {
                Served::Bytes(b) => b.slice(start..end),
                Served::File(f, _) => {
                    let mut v = vec![0u8; end - start];
                    f.read_exact_at(&mut v, range.start)
                        .map_err(|e| PieceError::Bad(format!("reading block {hash}: {e}")))?;
                    Bytes::from(v)
                }
            };
            (v, data)
        }
        None => {
            let block = whole(&served)?;
            let cvs = cut
                .cvs(&block)
                .ok_or_else(|| PieceError::Bad(format!("block {hash} changed length")))?;
            // Values of bytes that are not the block's would be kept and served for every
            // piece of it: a block that does not match its hash here is not served.
            if !cut.check_cvs(hash, &cvs) {
                return Err(PieceError::Bad(format!(
                    "block {hash} here does not match its hash"
                )));
            }
            let v = Arc::new(Values { len, cvs });
            keep(*hash, size_log2, v.clone());
            (v, block.slice(start..end))
        }
    };
    Ok(Piece {
        index,
        cvs: cvs.cvs.clone(),
        data,
    })
}

/// Piece `index` read alone ([`BlockServe::read_range`]) and checked against the kept values
/// `v`; `None` where the peer cannot read it alone or the bytes do not match.
fn from_range(
    svc: &dyn BlockServe,
    hash: &BlockHash,
    size_log2: u8,
    index: u32,
    v: &Values,
) -> Result<Option<Piece>, PieceError> {
    let Some((cut, r)) = cut(v.len, size_log2).and_then(|c| Some((c, c.range(index)?))) else {
        return Ok(None);
    };
    let data = svc
        .read_range(hash, r.start, (r.end - r.start) as usize)
        .map_err(|e| PieceError::Bad(e.to_string()))?;
    Ok(data
        .filter(|d| cut.check_piece(&v.cvs, index, d))
        .map(|data| Piece {
            index,
            cvs: v.cvs.clone(),
            data,
        }))
}

/// Whether `p` is piece `index` of block `hash` (of `len` bytes, cut in pieces of
/// `2^size_log2` within the wire's bounds), values and bytes both.
pub fn check(p: &Piece, hash: &BlockHash, len: u64, size_log2: u8, index: u32) -> bool {
    cut(len, size_log2).is_some_and(|c| p.check(hash, &c, index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_survives_its_encoding_and_malformed_bodies_are_refused() {
        let p = Piece {
            index: 3,
            cvs: vec![[1; 32], [2; 32]],
            data: Bytes::from_static(b"abc"),
        };
        assert_eq!(Piece::decode(Bytes::from(p.encode())), Some(p.clone()));
        let enc = p.encode();
        assert_eq!(Piece::decode(Bytes::from(enc[..7].to_vec())), None);
        assert_eq!(Piece::decode(Bytes::from(enc[..8 + 63].to_vec())), None);
        let mut huge = enc.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(Piece::decode(Bytes::from(huge)), None);
    }

    /// A block in memory that counts how it is read, and whose ranges may lie.
    struct Ranged {
        block: Bytes,
        gets: std::sync::atomic::AtomicUsize,
        ranges: std::sync::atomic::AtomicUsize,
        lie: std::sync::atomic::AtomicBool,
    }

    impl BlockServe for Ranged {
        fn get(&self, _h: &BlockHash) -> Result<Option<Served>, crate::blocks::BlockError> {
            self.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(Some(Served::Bytes(self.block.clone())))
        }
        fn put(&self, _h: &BlockHash, _d: Bytes) -> Result<(), crate::blocks::BlockError> {
            Err(crate::blocks::BlockError::NoUploads)
        }
        fn read_range(
            &self,
            _h: &BlockHash,
            start: u64,
            len: usize,
        ) -> Result<Option<Bytes>, crate::blocks::BlockError> {
            self.ranges
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut b = self.block[start as usize..start as usize + len].to_vec();
            if self.lie.load(std::sync::atomic::Ordering::Relaxed) {
                b[0] ^= 1;
            }
            Ok(Some(Bytes::from(b)))
        }
    }

    #[test]
    fn a_block_held_whole_is_read_once_for_its_values_then_a_piece_at_a_time() {
        use std::sync::atomic::Ordering::Relaxed;
        let block: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 17 % 253) as u8).collect();
        let hash = BlockHash::of(&block);
        let svc = Ranged {
            block: Bytes::from(block.clone()),
            gets: Default::default(),
            ranges: Default::default(),
            lie: Default::default(),
        };
        for i in 0..16 {
            let p = serve(&svc, &hash, 16, i).unwrap();
            assert!(check(&p, &hash, block.len() as u64, 16, i));
        }
        assert_eq!(svc.gets.load(Relaxed), 1, "the block read whole once");
        assert_eq!(svc.ranges.load(Relaxed), 15);
        // Bytes read alone that do not match their value are not served: the block is read
        // whole instead, and the piece is right.
        svc.lie.store(true, Relaxed);
        let p = serve(&svc, &hash, 16, 3).unwrap();
        assert!(check(&p, &hash, block.len() as u64, 16, 3));
        assert_eq!(svc.gets.load(Relaxed), 2);
    }
}
