//! Sets of piece indices, as the board and each schedule keep them.

/// A fixed-size set of piece indices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PieceSet {
    words: Vec<u64>,
    len: u32,
    count: u32,
}

impl PieceSet {
    pub fn new(len: u32) -> Self {
        PieceSet {
            words: vec![0; (len as usize).div_ceil(64)],
            len,
            count: 0,
        }
    }

    /// Adds `i`; whether it was new. Indices out of range are refused (they come from peers).
    pub fn insert(&mut self, i: u32) -> bool {
        if i >= self.len {
            return false;
        }
        let (w, b) = ((i / 64) as usize, i % 64);
        let new = self.words[w] & (1 << b) == 0;
        self.words[w] |= 1 << b;
        self.count += u32::from(new);
        new
    }

    /// Removes `i`; whether it was there.
    pub fn remove(&mut self, i: u32) -> bool {
        if !self.contains(i) {
            return false;
        }
        self.words[(i / 64) as usize] &= !(1 << (i % 64));
        self.count -= 1;
        true
    }

    pub fn contains(&self, i: u32) -> bool {
        i < self.len && self.words[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn full(&self) -> bool {
        self.count == self.len
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.len).filter(|&i| self.contains(i))
    }

    /// The indices in both sets, in order.
    pub fn iter_and<'a>(&'a self, other: &'a PieceSet) -> impl Iterator<Item = u32> + 'a {
        self.words
            .iter()
            .zip(&other.words)
            .enumerate()
            .flat_map(|(w, (&a, &b))| {
                let mut bits = a & b;
                std::iter::from_fn(move || {
                    (bits != 0).then(|| {
                        let i = bits.trailing_zeros();
                        bits &= bits - 1;
                        w as u32 * 64 + i
                    })
                })
            })
    }
}
