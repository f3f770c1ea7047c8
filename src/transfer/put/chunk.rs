//! Where a file's blocks begin and end.
//!
//! Fixed-size blocks shift after an insertion: every block past it changes, and a one-line edit
//! in the middle of a large file sends half of it again. Blocks cut by content (FastCDC 2020,
//! with normalized chunking at level 1) end where a rolling hash of the last bytes says so, so
//! an insertion moves only the boundaries around it and every later block keeps its hash.
//!
//! The default block size asks for content-defined blocks of 1 MiB to 16 MiB averaging
//! 4 MiB; any other block size asks for fixed blocks of that size, so that a caller who tunes
//! the size for range reads gets exactly the boundaries it asked for. A file of at most
//! [`Chunking::min_block`] bytes is one block either way, so a small file stays one block (sent
//! inline with its publish).
//!
//! Cutting streams: a buffer of [`Chunking::buffer_len`] bytes is refilled as blocks are cut
//! from it, so memory stays bounded whatever the file size, and each block is hashed where it
//! lies in the buffer, never copied out.

use std::io::Read;

use fastcdc::v2020::{self, Normalization};

use crate::manifest::{BlockRef, DEFAULT_BLOCK_SIZE};

/// How a file is cut into blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chunking {
    /// Blocks of this many bytes, the last one shorter.
    Fixed(u32),
    /// Boundaries chosen by content (FastCDC 2020).
    Content(ContentParams),
}

/// The sizes of content-defined blocks and the hash masks FastCDC derives from the average.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentParams {
    pub min: u32,
    pub avg: u32,
    pub max: u32,
    mask_s: u64,
    mask_l: u64,
}

impl ContentParams {
    /// Sizes inside FastCDC's ranges, each even, `min <= avg <= max`; `None` otherwise.
    pub fn new(min: u32, avg: u32, max: u32) -> Option<Self> {
        let ok = (v2020::MINIMUM_MIN..=v2020::MINIMUM_MAX).contains(&(min as usize))
            && (v2020::AVERAGE_MIN..=v2020::AVERAGE_MAX).contains(&(avg as usize))
            && (v2020::MAXIMUM_MIN..=v2020::MAXIMUM_MAX).contains(&(max as usize))
            && min <= avg
            && avg <= max
            && [min, avg, max].iter().all(|s| s % 2 == 0);
        if !ok {
            return None;
        }
        let (mask_s, mask_l) = v2020::select_masks(avg as usize, Normalization::Level1);
        Some(ContentParams {
            min,
            avg,
            max,
            mask_s,
            mask_l,
        })
    }

    /// The length of the block that starts `data`, which holds everything up to the file's end
    /// or at least `max` bytes (a cut found earlier than that is final either way).
    fn cut(&self, data: &[u8]) -> usize {
        let (_, end) = v2020::cut(
            data,
            self.min as usize,
            self.avg as usize,
            self.max as usize,
            self.mask_s,
            self.mask_l,
            self.mask_s << 1,
            self.mask_l << 1,
        );
        end
    }
}

/// The content-defined sizes behind [`DEFAULT_BLOCK_SIZE`]: a quarter and four times the
/// average, as FastCDC's authors suggest; the average stays the fixed size it replaced.
fn default_content() -> Chunking {
    let avg = DEFAULT_BLOCK_SIZE;
    match ContentParams::new(avg / 4, avg, avg * 4) {
        Some(p) => Chunking::Content(p),
        None => Chunking::Fixed(avg),
    }
}

impl Chunking {
    /// What a put with this `--block-size` cuts: content-defined blocks for the default size,
    /// fixed ones for any other.
    pub fn for_block_size(block_size: u32) -> Self {
        if block_size == DEFAULT_BLOCK_SIZE {
            default_content()
        } else {
            Chunking::Fixed(block_size.max(1))
        }
    }

    /// How the blocks of a manifest were cut, from its `block_size` (the longest block, see
    /// [`Chunking::max_block`]): content-defined where it is the default's longest block, fixed
    /// otherwise. A fixed size equal to that reads as content-defined; a getter that cuts an
    /// older copy the wrong way only finds fewer of its blocks.
    pub fn of_manifest(block_size: u32) -> Self {
        let content = default_content();
        if block_size == content.max_block() {
            content
        } else {
            Chunking::Fixed(block_size.max(1))
        }
    }

    /// The longest block it cuts: what a manifest's `block_size` says.
    pub fn max_block(&self) -> u32 {
        match self {
            Chunking::Fixed(n) => *n,
            Chunking::Content(p) => p.max,
        }
    }

    /// Files up to this long are one block.
    pub fn min_block(&self) -> u32 {
        match self {
            Chunking::Fixed(n) => *n,
            Chunking::Content(p) => p.min,
        }
    }

    /// The buffer [`hash_blocks`] works in for a file of `file_len` bytes. Content-defined
    /// blocks get room for a block and a half, so a refill moves at most the part of one block
    /// that was scanned already.
    pub fn buffer_len(&self, file_len: u64) -> usize {
        let full = match self {
            Chunking::Fixed(n) => *n as usize,
            Chunking::Content(p) => p.max as usize + p.max as usize / 2,
        };
        // One byte more than a small file, so that a short read says at once that it ended.
        full.min(
            usize::try_from(file_len)
                .unwrap_or(usize::MAX)
                .saturating_add(1),
        )
        .max(1)
    }
}

/// Cuts what `r` yields into blocks and hashes each; returns the bytes read and the blocks.
/// Blocks are never longer than `buf`, which a caller sizes with [`Chunking::buffer_len`]. A
/// reader that yields everything within `buf`'s first fill leaves its bytes at the start of
/// `buf` (what a publish sends inline).
pub fn hash_blocks(
    r: &mut impl Read,
    chunking: &Chunking,
    buf: &mut [u8],
) -> std::io::Result<(u64, Vec<BlockRef>)> {
    hash_blocks_with(r, chunking, buf, &mut |_, _, _| {})
}

/// [`hash_blocks`], handing each block to `found` as it is cut (its reference, its offset in
/// what `r` yields, its bytes): a put sends blocks while later ones are still being hashed.
pub fn hash_blocks_with(
    r: &mut impl Read,
    chunking: &Chunking,
    buf: &mut [u8],
    found: &mut dyn FnMut(&BlockRef, u64, &[u8]),
) -> std::io::Result<(u64, Vec<BlockRef>)> {
    let mut blocks = Vec::new();
    let mut size = 0u64;
    let (mut start, mut filled, mut eof) = (0usize, 0usize, false);
    loop {
        let avail = &buf[start..filled];
        let cut = match chunking {
            Chunking::Fixed(n) => avail.len().min(*n as usize),
            Chunking::Content(p) => p.cut(avail),
        };
        // A cut at the end of what is buffered may only be where the buffer ends: read more
        // first, unless the block is already as long as a block may be.
        let longest = match chunking {
            Chunking::Fixed(n) => *n as usize,
            Chunking::Content(p) => p.max as usize,
        }
        .min(buf.len());
        if !eof && cut == avail.len() && avail.len() < longest {
            buf.copy_within(start..filled, 0);
            filled -= start;
            start = 0;
            let n = read_full(r, &mut buf[filled..])?;
            filled += n;
            eof = filled < buf.len();
            continue;
        }
        if cut == 0 {
            break;
        }
        let block = &buf[start..start + cut];
        let r = BlockRef {
            hash: blake3::hash(block).as_bytes().to_vec(),
            len: cut as u32,
        };
        found(&r, size, block);
        blocks.push(r);
        size += cut as u64;
        start += cut;
    }
    Ok((size, blocks))
}

/// Reads until `buf` is full or the file ends.
pub fn read_full(f: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            v.extend_from_slice(&s.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        v.truncate(len);
        v
    }

    fn blocks(data: &[u8], c: &Chunking) -> Vec<BlockRef> {
        let mut buf = vec![0u8; c.buffer_len(data.len() as u64)];
        let (size, blocks) = hash_blocks(&mut &data[..], c, &mut buf).unwrap();
        assert_eq!(size, data.len() as u64);
        assert_eq!(
            blocks.iter().map(|b| u64::from(b.len)).sum::<u64>(),
            size,
            "blocks cover the file"
        );
        assert!(blocks.iter().all(|b| b.len > 0 && b.len <= c.max_block()));
        blocks
    }

    /// Blocks of `new` whose hash `old` lacks.
    fn changed(old: &[BlockRef], new: &[BlockRef]) -> usize {
        let had: std::collections::HashSet<&[u8]> = old.iter().map(|b| &b.hash[..]).collect();
        new.iter().filter(|b| !had.contains(&b.hash[..])).count()
    }

    fn with_line_inserted(data: &[u8]) -> Vec<u8> {
        let mid = data.len() / 2;
        let mut v = data[..mid].to_vec();
        v.extend_from_slice(b"a new line in the middle of the file\n");
        v.extend_from_slice(&data[mid..]);
        v
    }

    #[test]
    fn a_manifest_tells_how_its_blocks_were_cut() {
        for size in [DEFAULT_BLOCK_SIZE, 1 << 20, 256 << 10] {
            let c = Chunking::for_block_size(size);
            assert_eq!(Chunking::of_manifest(c.max_block()), c, "{size}");
        }
    }

    #[test]
    fn an_insertion_changes_at_most_two_content_defined_blocks() {
        let data = pseudo_random(40 << 20, 11);
        let edited = with_line_inserted(&data);
        let cdc = Chunking::for_block_size(DEFAULT_BLOCK_SIZE);
        assert!(matches!(cdc, Chunking::Content(_)));
        let (old, new) = (blocks(&data, &cdc), blocks(&edited, &cdc));
        assert!(old.len() >= 5, "40 MiB is several blocks: {}", old.len());
        let n = changed(&old, &new);
        assert!(n <= 2, "{n} of {} blocks changed", new.len());

        // The same check fails with fixed blocks: every block after the insertion shifts.
        let fixed = Chunking::Fixed(DEFAULT_BLOCK_SIZE);
        let n = changed(&blocks(&data, &fixed), &blocks(&edited, &fixed));
        assert!(n > 2, "fixed blocks: {n} changed");
    }

    #[test]
    fn cuts_do_not_depend_on_how_the_reader_splits_the_file() {
        // Reads of odd sizes, and a buffer smaller than a block and a half, cut where one read
        // of the whole file does.
        struct Dribble<'a>(&'a [u8]);
        impl Read for Dribble<'_> {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                let n = out.len().min(self.0.len()).min(777_777);
                out[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let data = pseudo_random(30 << 20, 5);
        let c = Chunking::for_block_size(DEFAULT_BLOCK_SIZE);
        let whole = blocks(&data, &c);
        let mut buf = vec![0u8; c.max_block() as usize + 1];
        let (_, dribbled) = hash_blocks(&mut Dribble(&data), &c, &mut buf).unwrap();
        assert_eq!(whole, dribbled);
    }

    #[test]
    fn small_files_are_one_block_held_at_the_start_of_the_buffer() {
        let c = Chunking::for_block_size(DEFAULT_BLOCK_SIZE);
        for len in [0usize, 1, 64 << 10, c.min_block() as usize] {
            let data = pseudo_random(len, 3);
            let mut buf = vec![0u8; c.buffer_len(len as u64)];
            let (size, b) = hash_blocks(&mut &data[..], &c, &mut buf).unwrap();
            assert_eq!(size as usize, len);
            assert_eq!(b.len(), usize::from(len > 0));
            assert_eq!(&buf[..len], &data[..]);
        }
        // Fixed blocks are what they were.
        let c = Chunking::for_block_size(4);
        assert_eq!(c, Chunking::Fixed(4));
        let b = blocks(&[7u8; 10], &c);
        assert_eq!(b.iter().map(|b| b.len).collect::<Vec<_>>(), [4, 4, 2]);
    }
}
