//! The store server's blocks, in one of two places: on its disk (small ones in RocksDB, large
//! ones as files named by hash, [`BlockFiles`], all of them in an index that says which exist
//! and where), or in an object store ([`Objects`]: cluster mode), each block an object named by
//! its hash, which is its own index.
//!
//! Large blocks are written as files without a sync, and known to the store (held, served,
//! counted by a publish's check) from a list in memory; the publish that first needs them makes
//! them durable ([`StoreBlocks::make_durable`]) with one sync for all of them, files first and
//! their index entries after, so a crash never leaves an index entry without its block, and a
//! key is never published before its blocks are safe. Uploads go on while a sync runs: the
//! sync once held every block write of the store (every tenant's) for its whole length.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;

use super::block_table::BlockTable;
use super::files::{BlockFiles, MIN_FILE_BLOCK};
use super::ref_table::RefTable;
pub use super::ref_table::CF_BLOCK_REFS;
use super::touched::Touched;
use super::{BlockError, BlockServe, Served};
use crate::db::{BatchOp, Db};
use crate::hash::{BlockHash, Scope};
use crate::locks;
use crate::objects::Objects;

pub const CF_BLOCKS: &str = "blocks";
/// Which blocks the store holds (hash -> length): asking RocksDB whether a blob-file value
/// exists reads the whole value and checks its CRC, 4 MiB per question.
pub const CF_BLOCK_INDEX: &str = "block_index";

/// Marks an index entry (`len: u32 BE` then this byte) whose block is in a file.
const IN_FILE: u8 = b'f';

/// The column families the store's blocks and their references take.
pub const FAMILIES: [&str; 3] = [CF_BLOCKS, CF_BLOCK_INDEX, CF_BLOCK_REFS];

pub struct StoreBlocks {
    /// The references (and on disk, small blocks and the index).
    pub(super) db: Db,
    place: Place,
    /// Blocks stored or asked about lately, which garbage collection keeps.
    pub(super) touched: Touched<BlockHash>,
    /// References written or asked about lately, which garbage collection keeps too.
    pub(super) touched_refs: Touched<(Scope, BlockHash)>,
    /// Where the namespaces' references are (see `refs`).
    pub(super) refs: Arc<dyn RefTable>,
}

/// Where the blocks' bytes are.
enum Place {
    Disk(Disk),
    Objects(Arc<Objects>, Option<Arc<dyn BlockTable>>),
}

/// Blocks on the store server's own disk.
struct Disk {
    files: BlockFiles,
    /// Block writes hold it shared and [`StoreBlocks::remove_orphan`] alone, so a file being
    /// written is never taken for an orphan before it is listed.
    write_gate: RwLock<()>,
    /// Large blocks written and not yet indexed, with their lengths: the next
    /// [`StoreBlocks::make_durable`] syncs their files and indexes them.
    unindexed: Mutex<HashMap<BlockHash, u32>>,
    /// One [`StoreBlocks::make_durable`] at a time: a publish that finds nothing left to index
    /// must still wait for the sync under way of the blocks it names.
    syncing: Mutex<()>,
}

/// A block's object name.
fn object_name(hash: &BlockHash) -> String {
    format!("{BLOCK_OBJECTS}{}", hash.hex())
}

/// Where in the object store the blocks are.
const BLOCK_OBJECTS: &str = "blocks/";

impl StoreBlocks {
    /// The blocks in `db` (which must have the [`FAMILIES`]) and `files`.
    pub fn new(db: Db, files: BlockFiles) -> Self {
        Self::at(
            db,
            Place::Disk(Disk {
                files,
                write_gate: RwLock::new(()),
                unindexed: Mutex::default(),
                syncing: Mutex::new(()),
            }),
        )
    }

    /// The blocks in `objects`, their references in `db`.
    pub fn on_objects(db: Db, objects: Arc<Objects>) -> Self {
        Self::at(db, Place::Objects(objects, None))
    }

    /// The same blocks on an object store, the small ones in `table` while it takes them
    /// (`block_table`); blocks are looked for in both.
    pub fn with_small_blocks(mut self, table: Arc<dyn BlockTable>) -> Self {
        if let Place::Objects(_, small) = &mut self.place {
            *small = Some(table);
        }
        self
    }

    fn at(db: Db, place: Place) -> Self {
        StoreBlocks {
            refs: super::ref_table::local(&db),
            db,
            place,
            touched: Touched::default(),
            touched_refs: Touched::default(),
        }
    }

    /// The same blocks, their references in `refs` (the metadata's table, which every replica
    /// of a store shares) rather than in the store's own database.
    pub fn with_references(mut self, refs: Arc<dyn RefTable>) -> Self {
        self.refs = refs;
        self
    }

    /// Whether a block of `len` bytes goes into the metadata's table (`block_table`): one a
    /// publish may write in its own change, beside the key that names it.
    pub fn in_meta(&self, len: usize) -> bool {
        matches!(&self.place, Place::Objects(_, Some(t)) if t.takes(len))
    }

    /// Notes a block about to be written elsewhere (in a publish's change), which garbage
    /// collection keeps meanwhile.
    pub fn touch(&self, hash: &BlockHash) {
        self.touched.touch(*hash);
    }

    /// Whether the blocks' place answers now: an object store's one listing; a disk does.
    pub fn check(&self) -> Result<(), BlockError> {
        match &self.place {
            Place::Disk(_) => Ok(()),
            Place::Objects(o, _) => Ok(o.check()?),
        }
    }

    /// The store's disk, if its blocks are there: `None` for an object store.
    fn disk(&self) -> Option<&Disk> {
        match &self.place {
            Place::Disk(d) => Some(d),
            Place::Objects(..) => None,
        }
    }

    /// Stores a block that has been verified against its hash (a block already here is left
    /// as it is).
    pub fn put(&self, hash: &BlockHash, data: &[u8]) -> Result<(), BlockError> {
        // Before the file is written: a collection pass takes it for an orphan otherwise.
        self.touched.touch(*hash);
        if let Place::Objects(_, Some(t)) = &self.place {
            // Asked of the table alone: whether the object store holds it too is a request
            // more, for each small file, to learn nothing a reader needs.
            if t.takes(data.len()) {
                if t.get(hash)?.is_none() {
                    t.put(hash, data)?;
                }
                return Ok(());
            }
        }
        if self.contains(hash)? {
            return Ok(());
        }
        self.write_new(hash, data)
    }

    /// Writes a block whether or not it is here already.
    pub(super) fn write_new(&self, hash: &BlockHash, data: &[u8]) -> Result<(), BlockError> {
        self.touched.touch(*hash);
        let disk = match &self.place {
            Place::Disk(d) => d,
            Place::Objects(o, small) => {
                match small {
                    Some(t) if t.takes(data.len()) => t.put(hash, data)?,
                    _ => o.put(&object_name(hash), Bytes::copy_from_slice(data))?,
                }
                return Ok(());
            }
        };
        let k = hash.as_bytes();
        let len = (data.len() as u32).to_be_bytes();
        // Small blocks go to RocksDB with the WAL, so many small files do not each force a sync
        // on publish.
        if data.len() < MIN_FILE_BLOCK {
            return Ok(self.db.write(vec![
                BatchOp::Put(CF_BLOCKS, k.to_vec(), data.to_vec()),
                BatchOp::Put(CF_BLOCK_INDEX, k.to_vec(), len.to_vec()),
            ])?);
        }
        {
            let _gate = locks::read(&disk.write_gate);
            disk.files
                .write(hash, data)
                .map_err(|e| disk.files.error(e))?;
            locks::lock(&disk.unindexed).insert(*hash, data.len() as u32);
        }
        Ok(())
    }

    /// Whether the store holds the block. A block whose file has gone (a disk replaced under
    /// the store) counts as missing, so that the next put uploads it again.
    pub fn contains(&self, hash: &BlockHash) -> Result<bool, BlockError> {
        Ok(self.stored_len(hash)?.is_some())
    }

    /// The length of a block the store holds, from its index entry (`None` as for
    /// [`StoreBlocks::contains`]): what a publish checks its manifest's lengths against.
    pub fn stored_len(&self, hash: &BlockHash) -> Result<Option<u32>, BlockError> {
        // Whoever asks is about to publish (or upload) it.
        self.touched.touch(*hash);
        let disk = match &self.place {
            Place::Disk(d) => d,
            Place::Objects(o, small) => {
                if let Some(b) = small.as_ref().map(|t| t.get(hash)).transpose()?.flatten() {
                    return Ok(u32::try_from(b.len()).ok());
                }
                // An object too long to be a block is not one the store wrote.
                return Ok(o
                    .len(&object_name(hash))?
                    .and_then(|n| u32::try_from(n).ok()));
            }
        };
        if let Some(len) = locks::lock(&disk.unindexed).get(hash) {
            return Ok(Some(*len));
        }
        let Some(v) = self.db.get(CF_BLOCK_INDEX, hash.as_bytes())? else {
            return Ok(None);
        };
        if v.get(4) == Some(&IN_FILE) && !disk.files.exists(hash) {
            return Ok(None);
        }
        // An entry too short to hold a length counts as missing: the next put writes it again.
        let Some(len) = v.get(..4).and_then(|b| <[u8; 4]>::try_from(b).ok()) else {
            tracing::warn!(block = %hash.hex(), "a block's index entry is corrupt");
            return Ok(None);
        };
        Ok(Some(u32::from_be_bytes(len)))
    }

    /// The blocks of `hashes` the store lacks.
    pub fn missing(&self, hashes: &[BlockHash]) -> Result<Vec<BlockHash>, BlockError> {
        let mut out = Vec::new();
        for h in hashes {
            if !self.contains(h)? {
                out.push(*h);
            }
        }
        Ok(out)
    }

    /// A block's bytes for the data plane: an open file for a large block (sent with
    /// sendfile), the value itself for a small one.
    pub fn get(&self, hash: &BlockHash) -> Result<Option<Served>, BlockError> {
        let disk = match &self.place {
            Place::Disk(d) => d,
            Place::Objects(o, small) => {
                if let Some(b) = small.as_ref().map(|t| t.get(hash)).transpose()?.flatten() {
                    return Ok(Some(Served::Bytes(b)));
                }
                return Ok(o.get(&object_name(hash))?.map(Served::Bytes));
            }
        };
        let unindexed = locks::lock(&disk.unindexed).contains_key(hash);
        let in_file = match unindexed {
            true => true,
            false => match self.db.get(CF_BLOCK_INDEX, hash.as_bytes())? {
                None => return Ok(None),
                Some(v) => v.get(4) == Some(&IN_FILE),
            },
        };
        if in_file {
            let found = disk
                .files
                .open_block(hash)
                .map_err(|e| disk.files.error(e))?;
            if found.is_none() {
                tracing::warn!(block = %hash.hex(), "the index names a block file that is gone");
            }
            return Ok(found.map(|(file, len)| Served::File(file, len)));
        }
        // Blocks stored in RocksDB: small ones, and every block of a store written before
        // large blocks moved to files. Readers check the hash, so RocksDB's CRC is skipped.
        Ok(self
            .db
            .get_unverified(CF_BLOCKS, hash.as_bytes())?
            .map(Served::Bytes))
    }

    /// Indexes the blocks of a store written before the index existed (a one-time pass that
    /// reads every block once).
    pub fn index_old_blocks(&self) -> Result<(), BlockError> {
        if self.disk().is_none()
            || !self.db.is_empty(CF_BLOCK_INDEX)?
            || self.db.is_empty(CF_BLOCKS)?
        {
            return Ok(());
        }
        tracing::info!("indexing the blocks of a store written by an older ktfs");
        let mut n = 0u64;
        self.db.for_each(CF_BLOCKS, |k, v| {
            n += 1;
            self.db
                .put(CF_BLOCK_INDEX, k, &(v.len() as u32).to_be_bytes())
        })?;
        tracing::info!(blocks = n, "blocks indexed");
        Ok(())
    }

    /// A collection pass starts: see [`Touched::rotate`].
    pub fn rotate_touched(&self) -> bool {
        self.touched_refs.rotate();
        self.touched.rotate()
    }

    pub fn was_touched(&self, hash: &BlockHash) -> bool {
        self.touched.contains(hash)
    }

    /// Calls `f` with every block the store holds: those uploaded and not yet indexed, then
    /// those in the index.
    pub fn for_each_block(&self, mut f: impl FnMut(BlockHash)) -> Result<(), BlockError> {
        let disk = match &self.place {
            Place::Disk(d) => d,
            Place::Objects(o, small) => {
                // Objects of other names under the prefix are not the store's blocks.
                o.list(BLOCK_OBJECTS, |name| {
                    if let Some(h) = BlockHash::from_hex(name) {
                        f(h);
                    }
                    Ok(())
                })?;
                if let Some(t) = small {
                    t.for_each(&mut |h, _| f(h))?;
                }
                return Ok(());
            }
        };
        let unindexed: Vec<BlockHash> = locks::lock(&disk.unindexed).keys().copied().collect();
        unindexed.into_iter().for_each(&mut f);
        self.db.for_each(CF_BLOCK_INDEX, |k, _| {
            if let Some(h) = BlockHash::from_slice(k) {
                f(h);
            }
            Ok(())
        })?;
        Ok(())
    }

    /// Deletes a block (index entry first, so a crash between leaves an orphan file, never an
    /// entry without its block); returns its length.
    pub fn remove(&self, hash: &BlockHash) -> Result<u64, BlockError> {
        let disk = match &self.place {
            Place::Disk(d) => d,
            Place::Objects(o, small) => {
                let mut len = 0;
                if let Some(t) = small {
                    if let Some(b) = t.get(hash)? {
                        t.remove(hash)?;
                        len = b.len() as u64;
                    }
                }
                let name = object_name(hash);
                if let Some(n) = o.len(&name)? {
                    o.delete(&name)?;
                    len = n;
                }
                return Ok(len);
            }
        };
        let unindexed = locks::lock(&disk.unindexed).remove(hash);
        let len = match unindexed {
            Some(len) => len,
            None => self
                .db
                .get(CF_BLOCK_INDEX, hash.as_bytes())?
                .and_then(|v| Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?)))
                .unwrap_or(0),
        };
        let k = hash.as_bytes().to_vec();
        self.db.write(vec![
            BatchOp::Delete(CF_BLOCK_INDEX, k.clone()),
            BatchOp::Delete(CF_BLOCKS, k),
        ])?;
        disk.files.remove(hash).map_err(|e| disk.files.error(e))?;
        Ok(u64::from(len))
    }

    /// Block files the index does not name: left by a crash between a file and its entry.
    /// An object store has no index, so none.
    pub fn orphan_files(&self) -> Result<Vec<BlockHash>, BlockError> {
        let mut out = Vec::new();
        let Some(disk) = self.disk() else {
            return Ok(out);
        };
        for h in disk.files.list().map_err(|e| disk.files.error(e))? {
            if self.db.get(CF_BLOCK_INDEX, h.as_bytes())?.is_none() {
                out.push(h);
            }
        }
        Ok(out)
    }

    /// Deletes an orphan block file if it still is one; whether it did.
    pub fn remove_orphan(&self, hash: &BlockHash) -> Result<bool, BlockError> {
        let Some(disk) = self.disk() else {
            return Ok(false);
        };
        let _gate = locks::write(&disk.write_gate);
        if locks::lock(&disk.unindexed).contains_key(hash)
            || self.db.get(CF_BLOCK_INDEX, hash.as_bytes())?.is_some()
        {
            return Ok(false);
        }
        disk.files.remove(hash).map_err(|e| disk.files.error(e))?;
        Ok(true)
    }

    /// [`StoreBlocks::make_durable`] where one of `named` is not indexed yet (written, or in a
    /// sync under way); at once otherwise.
    /// An object store's blocks are durable once written.
    pub fn make_durable_for(&self, named: &[BlockHash]) -> Result<(), BlockError> {
        let Some(disk) = self.disk() else {
            return Ok(());
        };
        let waits = {
            let unindexed = locks::lock(&disk.unindexed);
            named.iter().any(|h| unindexed.contains_key(h))
        };
        match waits {
            true => self.make_durable(),
            false => Ok(()),
        }
    }

    /// Syncs the files of the blocks written so far and indexes them. The entries go through
    /// the database's log, which the publish that asked syncs with its own change; a crash
    /// between the two leaves files the index does not know (uploaded again if asked for,
    /// collected as orphans), never an index entry without its block.
    pub fn make_durable(&self) -> Result<(), BlockError> {
        let Some(disk) = self.disk() else {
            return Ok(());
        };
        let _one = locks::lock(&disk.syncing);
        // Listed before the sync, so every one of them is a file the sync covers.
        let listed: Vec<(BlockHash, u32)> = locks::lock(&disk.unindexed)
            .iter()
            .map(|(h, len)| (*h, *len))
            .collect();
        if listed.is_empty() {
            return Ok(());
        }
        disk.files.sync().map_err(|e| disk.files.error(e))?;
        // Under the list's lock: a block collected since it was listed (its file gone) is not
        // indexed, and one collected after is found in the index.
        let mut unindexed = locks::lock(&disk.unindexed);
        let entries: Vec<BatchOp> = listed
            .iter()
            .filter(|(h, _)| unindexed.contains_key(h))
            .map(|(h, len)| {
                let mut v = len.to_be_bytes().to_vec();
                v.push(IN_FILE);
                BatchOp::Put(CF_BLOCK_INDEX, h.as_bytes().to_vec(), v)
            })
            .collect();
        self.db.write(entries)?;
        for (h, _) in &listed {
            unindexed.remove(h);
        }
        Ok(())
    }
}

/// The central block store, served on the data plane. Uploads are verified against their hash
/// by the data plane before they get here.
impl BlockServe for StoreBlocks {
    fn get(&self, hash: &BlockHash) -> Result<Option<Served>, BlockError> {
        StoreBlocks::get(self, hash)
    }

    fn put(&self, hash: &BlockHash, data: Bytes) -> Result<(), BlockError> {
        StoreBlocks::put(self, hash, &data)
    }

    fn put_for(&self, hash: &BlockHash, data: Bytes, scopes: &[Scope]) -> Result<(), BlockError> {
        StoreBlocks::put_for(self, scopes, hash, &data)
    }

    /// A piece of a block in an object store is one ranged GET: without it every piece a
    /// swarm asked the store for fetched its whole block from the object store (a 4 MiB GET
    /// for each 256 KiB piece). On disk the block is read whole, as before (a file's range
    /// comes through `Served::File`).
    fn read_range(
        &self,
        hash: &BlockHash,
        start: u64,
        len: usize,
    ) -> Result<Option<Bytes>, BlockError> {
        match &self.place {
            Place::Objects(o, small) => {
                if let Some(b) = small.as_ref().map(|t| t.get(hash)).transpose()?.flatten() {
                    let end = usize::try_from(start)
                        .ok()
                        .and_then(|s| Some((s, s.checked_add(len)?)));
                    return Ok(end.and_then(|(s, e)| (e <= b.len()).then(|| b.slice(s..e))));
                }
                Ok(o.get_range(&object_name(hash), start, len)?)
            }
            Place::Disk(_) => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &std::path::Path) -> StoreBlocks {
        let db = Db::open(&dir.join("db"), &[CF_BLOCKS, CF_BLOCK_INDEX], &[CF_BLOCKS]).unwrap();
        StoreBlocks::new(db, BlockFiles::open(&dir.join("blocks")).unwrap())
    }

    /// Uploads go on while a publish's sync runs (it held every block write of the store for
    /// its whole length), a block is held and served from its upload on, and once a sync made
    /// it durable it is in the index a restarted store reads.
    #[test]
    fn a_block_is_stored_and_served_while_a_sync_is_under_way_and_indexed_after() {
        let dir = tempfile::tempdir().unwrap();
        let data = vec![3u8; MIN_FILE_BLOCK * 2];
        let h = BlockHash::of(&data);
        {
            let s = store(dir.path());
            let disk = s.disk().unwrap();
            let under_way = locks::lock(&disk.syncing);
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    s.put(&h, &data).unwrap();
                    let served = matches!(s.get(&h).unwrap(), Some(Served::File(..)));
                    tx.send((s.stored_len(&h).unwrap(), served)).unwrap();
                });
                let got = rx.recv_timeout(std::time::Duration::from_secs(10));
                assert_eq!(got, Ok((Some(data.len() as u32), true)));
            });
            drop(under_way);
            assert!(s.db.get(CF_BLOCK_INDEX, h.as_bytes()).unwrap().is_none());
            s.make_durable().unwrap();
            assert!(locks::lock(&disk.unindexed).is_empty());
        }
        let again = store(dir.path());
        assert_eq!(again.stored_len(&h).unwrap(), Some(data.len() as u32));
        assert!(again.orphan_files().unwrap().is_empty());
    }

    /// On an object store every block is an object of its own, durable once written, and
    /// another store on the same objects (another replica) holds, serves and lists them.
    #[test]
    fn blocks_on_objects_are_held_served_and_collected_by_any_store_on_them() {
        let dir = tempfile::tempdir().unwrap();
        let url = crate::objects::ObjectUrl::Dir(dir.path().join("objects"));
        let on_objects = |db: &str| {
            let db = Db::open(&dir.path().join(db), &FAMILIES, &[CF_BLOCKS]).unwrap();
            StoreBlocks::on_objects(db, Arc::new(Objects::open(&url).unwrap()))
        };
        let small = b"small".to_vec();
        let large = vec![9u8; MIN_FILE_BLOCK * 2];
        let (hs, hl) = (BlockHash::of(&small), BlockHash::of(&large));
        let one = on_objects("one");
        one.put(&hs, &small).unwrap();
        one.put(&hl, &large).unwrap();
        one.make_durable().unwrap();
        let two = on_objects("two");
        assert_eq!(two.stored_len(&hl).unwrap(), Some(large.len() as u32));
        assert_eq!(two.missing(&[hs, hl]).unwrap(), []);
        match two.get(&hs).unwrap() {
            Some(Served::Bytes(b)) => assert_eq!(&b[..], &small[..]),
            _ => panic!("a block on objects is served from memory"),
        }
        let mut held = Vec::new();
        two.for_each_block(|h| held.push(h)).unwrap();
        held.sort_by_key(|h| h.0);
        let mut want = vec![hs, hl];
        want.sort_by_key(|h| h.0);
        assert_eq!(held, want);
        assert!(two.orphan_files().unwrap().is_empty());
        assert_eq!(two.remove(&hl).unwrap(), large.len() as u64);
        assert_eq!(one.stored_len(&hl).unwrap(), None);
        assert!(one.get(&hl).unwrap().is_none());
    }

    /// A piece of a block on objects is read alone (one ranged GET), and the piece the data
    /// plane serves from it is the block's; on disk the block is read whole, as before.
    #[test]
    fn a_piece_of_a_block_on_objects_is_read_alone() {
        let dir = tempfile::tempdir().unwrap();
        let url = crate::objects::ObjectUrl::Dir(dir.path().join("objects"));
        let db = Db::open(&dir.path().join("db"), &FAMILIES, &[CF_BLOCKS]).unwrap();
        let blocks = StoreBlocks::on_objects(db, Arc::new(Objects::open(&url).unwrap()));
        let block: Vec<u8> = (0..MIN_FILE_BLOCK * 4)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let h = BlockHash::of(&block);
        blocks.put(&h, &block).unwrap();
        let got = BlockServe::read_range(&blocks, &h, 1000, 4096)
            .unwrap()
            .unwrap();
        assert_eq!(&got[..], &block[1000..5096]);
        let missing = BlockHash::of(b"not stored");
        assert!(BlockServe::read_range(&blocks, &missing, 0, 1)
            .unwrap()
            .is_none());
        let log2 = 16;
        for index in [0u32, 3] {
            let p = crate::dataplane::piece::serve(&blocks, &h, log2, index).unwrap();
            let start = (index as usize) << log2;
            assert_eq!(&p.data[..], &block[start..start + (1 << log2)]);
        }
        let on_disk = store(&dir.path().join("disk"));
        on_disk.put(&h, &block).unwrap();
        assert!(BlockServe::read_range(&on_disk, &h, 0, 16)
            .unwrap()
            .is_none());
    }
}
