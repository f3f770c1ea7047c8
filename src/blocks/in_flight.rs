//! Blocks this node is receiving right now, served to children in a broadcast tree as soon as
//! each one is verified: the pipelining of the tree.
//!
//! A getter on this node streams to its agent the files it is filling and, block by block, what
//! it has written and verified. The agent serves those blocks in place from the getter's files,
//! re-checking each against its hash, and a child's request for a block that is expected but not
//! yet here waits for it (up to a bound) instead of being refused. When the getter's stream ends,
//! for whatever reason, its offer ends with it and the waiters are told at once.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::hash::subtree::{Cut, Cv, Piece};
use crate::hash::BlockHash;
use crate::locks::lock;

/// How long a peer's request for an expected block waits before it is answered "not here".
pub const PENDING_WAIT: Duration = Duration::from_secs(10);

/// A block's place in a file being filled. The file is held open, so the getter may rename
/// it into place while children still read from it.
#[derive(Clone, Debug)]
pub struct Place {
    pub file: Arc<File>,
    pub offset: u64,
    pub len: u32,
}

/// A block where it lies in a file of an offer: the file's device and inode, where the block
/// starts, and its hash. What this agent hashed there as it served it, a seed of the same
/// files need not hash again (`InPlace::register_known`); bytes changed since are still never
/// served, as every read of a place is checked against its hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Checked {
    pub dev: u64,
    pub ino: u64,
    pub offset: u64,
    pub hash: BlockHash,
}

/// How much of a block was hashed where it lies: all of it, or the pieces marked (values
/// `cvs`, checked against the block's hash when they were given).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hashed {
    Whole,
    Pieces {
        cut: Cut,
        cvs: Vec<Cv>,
        done: Vec<bool>,
    },
}

impl Checked {
    fn of(p: &Place, hash: BlockHash) -> Option<Checked> {
        let m = p.file.metadata().ok()?;
        Some(Checked {
            dev: m.dev(),
            ino: m.ino(),
            offset: p.offset,
            hash,
        })
    }
}

#[derive(Default)]
struct Offer {
    /// Every block this offer will hold, and where.
    expected: HashMap<BlockHash, Vec<Place>>,
    /// Those written and verified so far.
    ready: HashMap<BlockHash, Vec<Place>>,
    /// Blocks received in pieces (a swarm's sub-block pieces), not yet whole: the pieces
    /// written and verified so far, served before the block is whole.
    pieces: HashMap<BlockHash, Pieces>,
    /// Blocks hashed here whole as they were served.
    checked: HashSet<Checked>,
}

/// The pieces of one block written so far.
struct Pieces {
    cut: Cut,
    log2: u8,
    cvs: Vec<Cv>,
    ready: Vec<bool>,
    /// The pieces hashed here as they were served.
    checked: Vec<bool>,
}

#[derive(Default)]
struct State {
    offers: HashMap<u64, Offer>,
    next: u64,
}

/// The offers of this node.
pub struct InFlight {
    state: Mutex<State>,
    /// Bumped whenever a block becomes ready or an offer ends.
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight {
            state: Mutex::default(),
            changed: tokio::sync::watch::channel(0).0,
        }
    }
}

impl InFlight {
    /// Opens an offer of blocks at these places; they are served once marked ready.
    pub fn open(&self, expected: HashMap<BlockHash, Vec<Place>>) -> u64 {
        let mut st = lock(&self.state);
        st.next += 1;
        let id = st.next;
        st.offers.insert(
            id,
            Offer {
                expected,
                ..Default::default()
            },
        );
        id
    }

    /// Marks blocks of an offer written and verified. Unknown hashes are ignored.
    pub fn ready(&self, id: u64, hashes: &[BlockHash]) {
        if let Some(o) = lock(&self.state).offers.get_mut(&id) {
            for h in hashes {
                if let Some(p) = o.expected.get(h) {
                    o.ready.insert(*h, p.clone());
                }
            }
        }
        self.changed.send_modify(|n| *n += 1);
    }

    /// Marks pieces of a block of an offer written and verified: `cvs` are the block's
    /// chaining values for pieces of `2^log2` bytes, checked here against its hash. Unknown
    /// blocks, values that do not check and pieces out of range are ignored.
    pub fn ready_pieces(&self, id: u64, hash: &BlockHash, log2: u8, cvs: &[Cv], indices: &[u32]) {
        {
            let mut st = lock(&self.state);
            let Some(o) = st.offers.get_mut(&id) else {
                return;
            };
            let Some(len) = o.expected.get(hash).and_then(|p| p.first()).map(|p| p.len) else {
                return;
            };
            let Some(cut) = Cut::new(u64::from(len), 1u64 << log2.min(63)) else {
                return;
            };
            let fresh = o
                .pieces
                .get(hash)
                .is_none_or(|p| p.log2 != log2 || p.cvs != cvs);
            if fresh {
                if !cut.check_cvs(hash, cvs) {
                    return;
                }
                o.pieces.insert(
                    *hash,
                    Pieces {
                        cut,
                        log2,
                        cvs: cvs.to_vec(),
                        ready: vec![false; cut.count() as usize],
                        checked: vec![false; cut.count() as usize],
                    },
                );
            }
            if let Some(p) = o.pieces.get_mut(hash) {
                for &i in indices {
                    if let Some(r) = p.ready.get_mut(i as usize) {
                        *r = true;
                    }
                }
            }
        }
        self.changed.send_modify(|n| *n += 1);
    }

    /// Piece `index` of a block received in pieces of `2^log2` bytes, if it is written: read
    /// from the getter's file and checked against its value.
    pub fn read_piece(&self, hash: &BlockHash, log2: u8, index: u32) -> Option<Piece> {
        let found: Vec<(u64, Place, Cut, Vec<Cv>)> = {
            let st = lock(&self.state);
            st.offers
                .iter()
                .filter_map(|(&id, o)| {
                    let p = o.pieces.get(hash)?;
                    let ready = p.log2 == log2 && p.ready.get(index as usize) == Some(&true);
                    let place = o.expected.get(hash)?.first()?.clone();
                    ready.then(|| (id, place, p.cut, p.cvs.clone()))
                })
                .collect()
        };
        found.into_iter().find_map(|(id, place, cut, cvs)| {
            let r = cut.range(index)?;
            let mut buf = vec![0u8; (r.end - r.start) as usize];
            place
                .file
                .read_exact_at(&mut buf, place.offset + r.start)
                .ok()?;
            if !cut.check_piece(&cvs, index, &buf) {
                return None;
            }
            self.piece_checked(id, hash, (log2, &cvs), index);
            Some(Piece {
                index,
                cvs,
                data: Bytes::from(buf),
            })
        })
    }

    /// Notes piece `index` of `hash` (pieces of `2^log2` bytes with values `cvs`) hashed in
    /// offer `id`. A block whose pieces are all noted is as good as hashed whole: its values
    /// were checked against its hash when they were given.
    fn piece_checked(&self, id: u64, hash: &BlockHash, of: (u8, &[Cv]), index: u32) {
        let mut st = lock(&self.state);
        let done = st
            .offers
            .get_mut(&id)
            .and_then(|o| o.pieces.get_mut(hash))
            .filter(|p| p.log2 == of.0 && p.cvs == of.1)
            .and_then(|p| p.checked.get_mut(index as usize));
        if let Some(done) = done {
            *done = true;
        }
    }

    /// What of each block was hashed here as it was served, in the offers open now.
    pub fn checked(&self) -> HashMap<Checked, Hashed> {
        let st = lock(&self.state);
        let mut known = HashMap::new();
        for o in st.offers.values() {
            for (hash, p) in o.pieces.iter().filter(|(_, p)| p.checked.contains(&true)) {
                let place = o.expected.get(hash).and_then(|v| v.first());
                if let Some(c) = place.and_then(|place| Checked::of(place, *hash)) {
                    known.insert(
                        c,
                        Hashed::Pieces {
                            cut: p.cut,
                            cvs: p.cvs.clone(),
                            done: p.checked.clone(),
                        },
                    );
                }
            }
            // A block hashed whole covers what its pieces said.
            known.extend(o.checked.iter().map(|&c| (c, Hashed::Whole)));
        }
        known
    }

    /// Whether an offer will hold this piece but does not yet (nor the whole block).
    fn piece_pending(&self, hash: &BlockHash, log2: u8, index: u32) -> bool {
        let st = lock(&self.state);
        let expected = st.offers.values().any(|o| o.expected.contains_key(hash));
        let here = st.offers.values().any(|o| {
            o.ready.contains_key(hash)
                || o.pieces
                    .get(hash)
                    .is_some_and(|p| p.log2 == log2 && p.ready.get(index as usize) == Some(&true))
        });
        expected && !here
    }

    /// Waits until piece `index` of `hash` is no longer pending (it or its block is ready, or
    /// its offer ended), at most `limit`.
    pub async fn wait_piece(&self, hash: &BlockHash, log2: u8, index: u32, limit: Duration) {
        let mut rx = self.changed.subscribe();
        let _ = tokio::time::timeout(limit, async {
            while self.piece_pending(hash, log2, index) {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
    }

    pub fn close(&self, id: u64) {
        lock(&self.state).offers.remove(&id);
        self.changed.send_modify(|n| *n += 1);
    }

    fn lookup(&self, hash: &BlockHash) -> (Vec<(u64, Place)>, bool) {
        let st = lock(&self.state);
        let mut places = Vec::new();
        let mut expected = false;
        for (&id, o) in &st.offers {
            if let Some(p) = o.ready.get(hash) {
                places.extend(p.iter().map(|p| (id, p.clone())));
            }
            expected |= o.expected.contains_key(hash);
        }
        (places, expected)
    }

    /// A ready block's bytes, read from the getter's file and checked against the hash.
    pub fn read(&self, hash: &BlockHash) -> Option<Bytes> {
        let (places, _) = self.lookup(hash);
        places.iter().find_map(|(id, p)| {
            let mut buf = vec![0u8; p.len as usize];
            p.file.read_exact_at(&mut buf, p.offset).ok()?;
            if BlockHash::of(&buf) != *hash {
                return None;
            }
            if let Some(c) = Checked::of(p, *hash) {
                if let Some(o) = lock(&self.state).offers.get_mut(id) {
                    o.checked.insert(c);
                }
            }
            Some(Bytes::from(buf))
        })
    }

    /// Whether an offer will hold this block but does not yet.
    pub fn pending(&self, hash: &BlockHash) -> bool {
        let (places, expected) = self.lookup(hash);
        expected && places.is_empty()
    }

    /// Waits until `hash` is no longer pending (ready, or its offer ended), at most `limit`.
    pub async fn wait(&self, hash: &BlockHash, limit: Duration) {
        let mut rx = self.changed.subscribe();
        let _ = tokio::time::timeout(limit, async {
            while self.pending(hash) {
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_wake_when_a_block_is_ready_or_its_offer_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data = vec![5u8; 1000];
        std::fs::write(&path, vec![0u8; 1000]).unwrap();
        let h = BlockHash::of(&data);
        let place = Place {
            file: Arc::new(File::open(&path).unwrap()),
            offset: 0,
            len: 1000,
        };
        let inf = Arc::new(InFlight::default());
        let id = inf.open(HashMap::from([(h, vec![place])]));
        assert!(inf.pending(&h));
        assert!(inf.read(&h).is_none());

        let waiter = {
            let inf = inf.clone();
            tokio::spawn(async move {
                inf.wait(&h, Duration::from_secs(30)).await;
                inf.read(&h)
            })
        };
        tokio::task::yield_now().await;
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all_at(&data, 0)
            .unwrap();
        inf.ready(id, &[h]);
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
        assert_eq!(got.as_deref(), Some(&data[..]));

        // Bytes that no longer match are never served.
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all_at(&[6u8; 1000], 0)
            .unwrap();
        assert!(inf.read(&h).is_none());

        // An offer that ends wakes its waiters: the block is no longer expected.
        let other = BlockHash::of(b"other");
        let id2 = inf.open(HashMap::from([(
            other,
            vec![Place {
                file: Arc::new(File::open(&path).unwrap()),
                offset: 0,
                len: 5,
            }],
        )]));
        let waiter = {
            let inf = inf.clone();
            tokio::spawn(async move { inf.wait(&other, Duration::from_secs(30)).await })
        };
        tokio::task::yield_now().await;
        inf.close(id2);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
        assert!(!inf.pending(&other));
        inf.close(id);
    }

    #[tokio::test]
    async fn pieces_of_a_block_in_flight_are_served_as_they_are_ready_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let h = BlockHash::of(&data);
        let cut = Cut::new(200_000, 1 << 16).unwrap();
        let cvs = cut.cvs(&data).unwrap();
        // The getter's file, the block 5 bytes in, nothing written yet.
        std::fs::write(&path, vec![0u8; 200_005]).unwrap();
        let place = Place {
            file: Arc::new(File::open(&path).unwrap()),
            offset: 5,
            len: 200_000,
        };
        let inf = Arc::new(InFlight::default());
        let id = inf.open(HashMap::from([(h, vec![place])]));
        assert!(inf.read_piece(&h, 16, 1).is_none());
        let waiter = {
            let inf = inf.clone();
            tokio::spawn(async move {
                inf.wait_piece(&h, 16, 1, Duration::from_secs(30)).await;
                inf.read_piece(&h, 16, 1)
            })
        };
        tokio::task::yield_now().await;
        let r = cut.range(1).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all_at(&data[r.start as usize..r.end as usize], 5 + r.start)
            .unwrap();
        // Values that are not the block's are refused; the block's are taken.
        let mut lying = cvs.clone();
        lying[0][0] ^= 1;
        inf.ready_pieces(id, &h, 16, &lying, &[1]);
        assert!(inf.read_piece(&h, 16, 1).is_none());
        inf.ready_pieces(id, &h, 16, &cvs, &[1]);
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap()
            .expect("piece 1");
        assert_eq!(&got.data[..], &data[r.start as usize..r.end as usize]);
        assert!(got.check(&h, &cut, 1));
        // One piece of four hashed as it was served: that piece is known hashed, not the block.
        let known: Vec<Hashed> = inf.checked().into_values().collect();
        assert!(
            matches!(&known[..], [Hashed::Pieces { done, .. }] if done == &[false, true, false, false]),
            "{known:?}"
        );
        // Only what was said to be ready, of that cut, and while its bytes still match.
        assert!(inf.read_piece(&h, 16, 0).is_none());
        assert!(inf.read_piece(&h, 17, 0).is_none());
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all_at(&[9], 5 + r.start)
            .unwrap();
        assert!(inf.read_piece(&h, 16, 1).is_none());
        inf.close(id);
        assert!(inf.read_piece(&h, 16, 1).is_none());
    }

    #[test]
    fn the_pieces_hashed_as_they_were_served_are_known() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 3 % 253) as u8).collect();
        let h = BlockHash::of(&data);
        let cut = Cut::new(200_000, 1 << 16).unwrap();
        let cvs = cut.cvs(&data).unwrap();
        std::fs::write(&path, &data).unwrap();
        let file = Arc::new(File::open(&path).unwrap());
        let inf = InFlight::default();
        let place = Place {
            file: file.clone(),
            offset: 0,
            len: 200_000,
        };
        let id = inf.open(HashMap::from([(h, vec![place])]));
        let all: Vec<u32> = (0..cut.count()).collect();
        inf.ready_pieces(id, &h, 16, &cvs, &all);
        let meta = file.metadata().unwrap();
        let at = Checked {
            dev: meta.dev(),
            ino: meta.ino(),
            offset: 0,
            hash: h,
        };
        assert!(inf.checked().is_empty());
        for &i in &all {
            assert!(inf.read_piece(&h, 16, i).is_some());
            let mut done = vec![false; all.len()];
            done[..=i as usize].fill(true);
            let pieces = Hashed::Pieces {
                cut,
                cvs: cvs.clone(),
                done,
            };
            assert_eq!(inf.checked(), HashMap::from([(at, pieces)]), "piece {i}");
        }
        // What an offer knew ends with it.
        inf.close(id);
        assert!(inf.checked().is_empty());
    }
}
