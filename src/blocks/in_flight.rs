//! Blocks this node is receiving right now, served to children in a broadcast tree as soon as
//! each one is verified: the pipelining of the tree.
//!
//! A getter on this node streams to its agent the files it is filling and, block by block, what
//! it has written and verified. The agent serves those blocks in place from the getter's files,
//! re-checking each against its hash, and a child's request for a block that is expected but not
//! yet here waits for it (up to a bound) instead of being refused. When the getter's stream ends,
//! for whatever reason, its offer ends with it and the waiters are told at once.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

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

#[derive(Default)]
struct Offer {
    /// Every block this offer will hold, and where.
    expected: HashMap<BlockHash, Vec<Place>>,
    /// Those written and verified so far.
    ready: HashMap<BlockHash, Vec<Place>>,
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
                ready: HashMap::new(),
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

    pub fn close(&self, id: u64) {
        lock(&self.state).offers.remove(&id);
        self.changed.send_modify(|n| *n += 1);
    }

    fn lookup(&self, hash: &BlockHash) -> (Vec<Place>, bool) {
        let st = lock(&self.state);
        let mut places = Vec::new();
        let mut expected = false;
        for o in st.offers.values() {
            if let Some(p) = o.ready.get(hash) {
                places.extend(p.iter().cloned());
            }
            expected |= o.expected.contains_key(hash);
        }
        (places, expected)
    }

    /// A ready block's bytes, read from the getter's file and checked against the hash.
    pub fn read(&self, hash: &BlockHash) -> Option<Bytes> {
        let (places, _) = self.lookup(hash);
        places.iter().find_map(|p| {
            let mut buf = vec![0u8; p.len as usize];
            p.file.read_exact_at(&mut buf, p.offset).ok()?;
            (BlockHash::of(&buf) == *hash).then(|| Bytes::from(buf))
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
}
