//! Pieces of a block, each verified on its own before the block is whole.
//!
//! A block's hash is BLAKE3, and BLAKE3 is a tree: a block cut at multiples of a power of two
//! (at least a 1 KiB chunk) is cut along subtrees, and each piece has a chaining value that its
//! own bytes determine (with its offset). The chaining values of all pieces merge, along the
//! tree's shape, into the block's hash. So a receiver given a block's chaining values (32 bytes
//! a piece) by anyone checks them against the hash it trusts, then checks each piece it gets,
//! from whomever, against its chaining value: a piece can be verified, and forwarded, long
//! before the block is whole. This is what lets a swarm trade pieces smaller than blocks.
//!
//! A block of one piece (no longer than the piece size) has its hash as its one "chaining
//! value", and its piece is checked as a whole block is.

use std::ops::Range;

use blake3::hazmat::{self, ChainingValue, HasherExt, Mode};
use bytes::Bytes;

use super::BlockHash;

/// A piece's chaining value (or, for a block of one piece, the block's hash).
pub type Cv = [u8; 32];

/// The smallest piece: BLAKE3's chunk. Smaller cuts are not subtrees.
pub const MIN_PIECE: u64 = blake3::CHUNK_LEN as u64;
/// The smallest piece a swarm cuts and the data plane serves, as a power of two: 64 KiB, so
/// that a block's values take at most 1/2048 of its bytes and a piece is worth a request.
pub const MIN_SWARM_PIECE_LOG2: u8 = 16;

/// How one block is cut: pieces of `size` bytes from its start, the last one shorter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cut {
    len: u64,
    size: u64,
}

impl Cut {
    /// A block of `len` bytes cut into pieces of `size` bytes: `None` unless `size` is a power
    /// of two of at least [`MIN_PIECE`].
    pub fn new(len: u64, size: u64) -> Option<Self> {
        (size >= MIN_PIECE && size.is_power_of_two()).then_some(Cut { len, size })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Pieces in the block (an empty block is one empty piece).
    pub fn count(&self) -> u32 {
        self.len.div_ceil(self.size).max(1) as u32
    }

    /// Where piece `i` lies in the block.
    pub fn range(&self, i: u32) -> Option<Range<u64>> {
        (i < self.count()).then(|| {
            let start = u64::from(i) * self.size;
            start..(start + self.size).min(self.len)
        })
    }

    /// The chaining values of the block's pieces, from its bytes (`block.len()` must be the
    /// cut's length; `None` otherwise).
    pub fn cvs(&self, block: &[u8]) -> Option<Vec<Cv>> {
        if block.len() as u64 != self.len {
            return None;
        }
        if self.count() == 1 {
            return Some(vec![*blake3::hash(block).as_bytes()]);
        }
        (0..self.count())
            .map(|i| {
                let r = self.range(i)?;
                let bytes = block.get(r.start as usize..r.end as usize)?;
                Some(piece_cv(r.start, bytes))
            })
            .collect()
    }

    /// Whether `cvs` are the chaining values of the pieces of the block `hash`.
    pub fn check_cvs(&self, hash: &BlockHash, cvs: &[Cv]) -> bool {
        if cvs.len() != self.count() as usize {
            return false;
        }
        if self.count() == 1 {
            return cvs[0] == hash.0;
        }
        let left = hazmat::left_subtree_len(self.len);
        let (l, r) = (self.merge(cvs, 0, left), self.merge(cvs, left, self.len));
        hazmat::merge_subtrees_root(&l, &r, Mode::Hash).as_bytes() == &hash.0
    }

    /// Whether `data` is piece `i` of the block whose pieces' chaining values are `cvs`
    /// (checked with [`Cut::check_cvs`] first).
    pub fn check_piece(&self, cvs: &[Cv], i: u32, data: &[u8]) -> bool {
        let (Some(r), Some(cv)) = (self.range(i), cvs.get(i as usize)) else {
            return false;
        };
        if data.len() as u64 != r.end - r.start || cvs.len() != self.count() as usize {
            return false;
        }
        if self.count() == 1 {
            return blake3::hash(data).as_bytes() == cv;
        }
        &piece_cv(r.start, data) == cv
    }

    /// The chaining value of the subtree over `start..end` (a subtree of the block's tree,
    /// longer than one chunk or one piece exactly), from the pieces' values.
    fn merge(&self, cvs: &[Cv], start: u64, end: u64) -> ChainingValue {
        if end - start <= self.size {
            return cvs[(start / self.size) as usize];
        }
        let mid = start + hazmat::left_subtree_len(end - start);
        let (l, r) = (self.merge(cvs, start, mid), self.merge(cvs, mid, end));
        hazmat::merge_subtrees_non_root(&l, &r, Mode::Hash)
    }
}

/// A piece as it arrived: unchecked until [`Piece::check`] says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub index: u32,
    pub cvs: Vec<Cv>,
    pub data: Bytes,
}

impl Piece {
    /// The bytes of an `OP_PIECE` frame after the hash.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 32 * self.cvs.len() + self.data.len());
        out.extend_from_slice(&self.index.to_be_bytes());
        out.extend_from_slice(&(self.cvs.len() as u32).to_be_bytes());
        for cv in &self.cvs {
            out.extend_from_slice(cv);
        }
        out.extend_from_slice(&self.data);
        out
    }

    /// Reads what [`Piece::encode`] wrote; `None` for a malformed body (it comes from a peer).
    pub fn decode(mut body: Bytes) -> Option<Piece> {
        let head = body.get(..8)?;
        let index = u32::from_be_bytes(head[..4].try_into().ok()?);
        let count = u32::from_be_bytes(head[4..8].try_into().ok()?) as usize;
        let cvs_len = count.checked_mul(32)?;
        let rest = body.split_off(8);
        let cvs = rest
            .get(..cvs_len)?
            .chunks_exact(32)
            .map(|c| c.try_into().ok())
            .collect::<Option<Vec<Cv>>>()?;
        Some(Piece {
            index,
            cvs,
            data: rest.slice(cvs_len..),
        })
    }

    /// Whether this is piece `index` of block `hash` cut as `cut` says, values and bytes both.
    pub fn check(&self, hash: &BlockHash, cut: &Cut, index: u32) -> bool {
        self.index == index
            && cut.check_cvs(hash, &self.cvs)
            && cut.check_piece(&self.cvs, index, &self.data)
    }
}

/// The chaining value of the bytes at `offset` of a block, as a subtree that is not its root.
fn piece_cv(offset: u64, bytes: &[u8]) -> Cv {
    blake3::Hasher::new()
        .set_input_offset(offset)
        .update(bytes)
        .finalize_non_root()
}

#[cfg(test)]
mod tests {
    use super::*;

    use test_support::pattern as bytes;

    #[test]
    fn every_piece_of_blocks_of_any_length_checks_against_the_block_hash() {
        let k = 1024usize;
        for (len, size) in [
            (0, 1024),
            (1, 1024),
            (1024, 1024),
            (1025, 1024),
            (3 * k, 1024),
            (64 * k, 16 * k),
            (64 * k + 1, 16 * k),
            (100 * k + 77, 16 * k),
            (1_000_003, 64 * k),
            (4 << 20, 512 * k),
            (4 * k, 64 * k),
        ] {
            let block = bytes(len, len as u64);
            let hash = BlockHash::of(&block);
            let cut = Cut::new(len as u64, size as u64).unwrap();
            let cvs = cut.cvs(&block).unwrap();
            assert_eq!(cvs.len(), cut.count() as usize);
            assert!(cut.check_cvs(&hash, &cvs), "len {len} size {size}");
            for i in 0..cut.count() {
                let r = cut.range(i).unwrap();
                let piece = &block[r.start as usize..r.end as usize];
                assert!(cut.check_piece(&cvs, i, piece), "len {len} piece {i}");
            }
            // The pieces tile the block.
            let tiled: u64 = (0..cut.count())
                .map(|i| cut.range(i).map_or(0, |r| r.end - r.start))
                .sum();
            assert_eq!(tiled, len as u64);
        }
    }

    #[test]
    fn a_changed_byte_a_wrong_place_or_a_lying_chaining_value_is_refused() {
        let block = bytes(300_000, 5);
        let hash = BlockHash::of(&block);
        let cut = Cut::new(300_000, 64 << 10).unwrap();
        assert_eq!(cut.count(), 5);
        let cvs = cut.cvs(&block).unwrap();
        let piece = |i: u32| {
            let r = cut.range(i).unwrap();
            block[r.start as usize..r.end as usize].to_vec()
        };
        let mut bad = piece(2);
        bad[100] ^= 1;
        assert!(!cut.check_piece(&cvs, 2, &bad));
        // Piece 1's bytes are not piece 2, even where they are of the same length.
        assert!(!cut.check_piece(&cvs, 2, &piece(1)));
        assert!(!cut.check_piece(&cvs, 4, &piece(1)), "a wrong length");
        assert!(!cut.check_piece(&cvs, 5, &piece(4)), "no such piece");
        // Chaining values that are not this block's: changed, from another block, too few.
        let mut lying = cvs.clone();
        lying[3][0] ^= 1;
        assert!(!cut.check_cvs(&hash, &lying));
        let other = bytes(300_000, 6);
        assert!(!cut.check_cvs(&hash, &cut.cvs(&other).unwrap()));
        assert!(!cut.check_cvs(&hash, &cvs[..4]));
        // A piece checked against values that passed no check proves nothing of the block:
        // a liar's values match the liar's bytes, which is why the values are checked first.
        let fake = cut.cvs(&other).unwrap();
        let r = cut.range(2).unwrap();
        assert!(cut.check_piece(&fake, 2, &other[r.start as usize..r.end as usize]));
        assert!(!cut.check_cvs(&hash, &fake));
        // A block of one piece: its hash is its value.
        let small = bytes(5000, 7);
        let one = Cut::new(5000, 64 << 10).unwrap();
        let v = one.cvs(&small).unwrap();
        assert_eq!(v, vec![BlockHash::of(&small).0]);
        assert!(one.check_cvs(&BlockHash::of(&small), &v));
        assert!(!one.check_piece(&v, 0, &small[1..]));
        // Cuts that are not along subtrees are refused.
        assert!(Cut::new(5000, 1000).is_none());
        assert!(Cut::new(5000, 512).is_none());
        assert!(cut.cvs(&block[1..]).is_none(), "bytes of another length");
    }
}
