//! The metadata's tables on an engine: each table a one-byte prefix of the engine's keyspace,
//! served to the synchronous core (`MetaBackend`, which plans under its write lock on blocking
//! threads) by a runtime of its own, so a call blocks only its caller's thread, from whatever
//! thread it comes. Group commit's batch becomes as few transactions as the engine's limits
//! hold, each change whole in one of them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::fence::Fence;
use super::owned::{Applied, Lookup, OwnedReads};
use super::seam::{
    prefix_end, Compare, EngineError, MetaEngine, Txn, Write, MAX_TXN_BYTES, MAX_TXN_OPS,
    OP_OVERHEAD,
};
use crate::bridge::Bridge;
use crate::meta::backend::{BackendError, KeyValue, MetaBackend, Op, ReadMany, Step, Table, Visit};

/// How many entries a page of `table` starts at, and the most it grows to while pages stay
/// small: a walk of a million keys is a few hundred requests, not thousands, and each asks
/// etcd to count the rest of the range (its cost grows with what lies beyond the page).
/// Manifests may be large (up to etcd's 1.5 MiB each where no object store holds the large
/// ones): a page of them starts at 4 and grows to no more than 64 (96 MiB at most, within the
/// largest answer taken from etcd); beside an object store the tables hold manifests of 2 KiB
/// or less, which walk in 16 times fewer pages than at 4 a page (a collection's walk of them
/// all; etcd counts the rest of the range for every page).
fn page_len(table: Table) -> (usize, usize) {
    match table {
        Table::Manifests => (4, 64),
        _ => (256, 4096),
    }
}

/// The layout of the tables in an engine, as this build writes it. A server of an older build
/// refuses an engine a newer one has written (a rolling upgrade's old replicas stop rather
/// than misread what the new ones write); a newer build upgrades an older layout, or refuses
/// it, at its start.
///
/// 1: every manifest an object where the store has an object store; 2: small manifests in the
/// tables (`manifests::INLINE_MAX`), which a build of layout 1 would not find; 3: small blocks
/// in the tables (`blocks::block_table`), which a build of layout 2 would not find.
pub const SCHEMA: u32 = 3;

/// Where the layout's number lies, beside the tables (whose keys begin with their tag).
const SCHEMA_KEY: &[u8] = b"schema";

/// Checks the engine's layout against this build's, writing it where the engine holds none
/// yet (a new prefix, or one a build before the number wrote).
async fn settle_schema(engine: &dyn MetaEngine) -> Result<(), EngineError> {
    let (found, modified) = match engine.get(SCHEMA_KEY).await? {
        Some(e) => std::str::from_utf8(&e.value)
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .map(|n| (n, e.modified))
            .ok_or_else(|| {
                EngineError::Schema(format!(
                    "the metadata's layout is {:?}, not a number this server knows",
                    String::from_utf8_lossy(&e.value)
                ))
            })?,
        None => {
            let claim = Txn::new()
                .when_modified_at(SCHEMA_KEY, 0)
                .put(SCHEMA_KEY, SCHEMA.to_string());
            return match engine.txn(claim).await {
                // Another server wrote it meanwhile: read what it wrote.
                Ok(_) => Ok(()),
                Err(EngineError::Conflict) => Box::pin(settle_schema(engine)).await,
                Err(e) => Err(e),
            };
        }
    };
    if found > SCHEMA {
        return Err(EngineError::Schema(format!(
            "the metadata was written by a newer ktfs (layout {found}; this server knows {SCHEMA}): \
             upgrade this server"
        )));
    }
    if found < SCHEMA {
        // Every layout before this one reads as this one does; from now on a server of an
        // older build refuses the store at its start.
        let upgrade = Txn::new()
            .when_modified_at(SCHEMA_KEY, modified)
            .put(SCHEMA_KEY, SCHEMA.to_string());
        return match engine.txn(upgrade).await {
            Ok(_) => Ok(()),
            Err(EngineError::Conflict) => Box::pin(settle_schema(engine)).await,
            Err(e) => Err(e),
        };
    }
    Ok(())
}

/// A page of about this many bytes or fewer lets the next one be twice as long.
const SMALL_PAGE: usize = 256 << 10;

fn tag(table: Table) -> u8 {
    match table {
        Table::Keys => b'k',
        Table::Manifests => b'm',
        Table::Locations => b'l',
        Table::Attrs => b'a',
        Table::Inodes => b'i',
        Table::Graveyard => b'g',
        Table::BlockRefs => b'r',
        Table::Blocks => b'b',
    }
}

/// Whether the owner may answer `key` (an engine key) from its memory of what it read and
/// wrote: not the block references nor the small blocks, which every replica writes
/// (`MetaBackend::write_shared`), and which a rebuild or a tree of small files would otherwise
/// pour into that memory by the million.
fn remembered(key: &[u8]) -> bool {
    key.first() != Some(&tag(Table::BlockRefs)) && key.first() != Some(&tag(Table::Blocks))
}

fn engine_key(table: Table, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(tag(table));
    k.extend_from_slice(key);
    k
}

fn backend_err(e: EngineError) -> BackendError {
    BackendError(Box::new(e))
}

/// One call on the engine, as the tables' runtime runs it.
type Call<T> = std::pin::Pin<Box<dyn Future<Output = Result<T, EngineError>> + Send>>;

/// The tables on `engine`.
pub struct EngineTables {
    engine: Arc<dyn MetaEngine>,
    bridge: Bridge,
    /// The page length the last walk grew to. A walk that goes on from within its prefix (a
    /// listing's next page, thousands of entries) starts there, as on etcd each request
    /// counts the rest of the range; one from the prefix's start (whether anything lies
    /// below, most often) starts small.
    grown: AtomicUsize,
    /// Where several replicas may serve the engine, the claim every write must still hold.
    fence: Option<Arc<Fence>>,
    /// What this replica read and wrote while it owns the store.
    owned: OwnedReads,
}

impl EngineTables {
    /// Makes the engine with `connect` on the tables' own runtime (an engine's connections
    /// live on the runtime that made them).
    pub fn connect<E, F>(connect: impl FnOnce() -> F + Send + 'static) -> Result<Self, EngineError>
    where
        E: MetaEngine,
        F: Future<Output = Result<E, EngineError>> + Send + 'static,
    {
        let bridge = Bridge::new("kt-meta-engine").map_err(EngineError::other)?;
        let engine = on(&bridge, connect())?;
        let engine: Arc<dyn MetaEngine> = Arc::new(engine);
        let at = engine.clone();
        on(&bridge, async move { settle_schema(at.as_ref()).await })?;
        Ok(EngineTables {
            grown: AtomicUsize::new(page_len(Table::Keys).0),
            engine,
            bridge,
            fence: None,
            owned: OwnedReads::default(),
        })
    }

    /// Writes only while `fence` holds: a replica that does not own the store writes nothing.
    pub fn fenced(mut self, fence: Arc<Fence>) -> Self {
        self.fence = Some(fence);
        self
    }

    /// The revision of the claim this replica writes under, while it holds one.
    fn claim(&self) -> Option<super::seam::Revision> {
        let fence = self.fence.as_ref()?;
        fence.compare().ok().map(|c| c.modified)
    }

    fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(Arc<dyn MetaEngine>) -> Call<T>,
    ) -> Result<T, BackendError> {
        on(&self.bridge, f(self.engine.clone())).map_err(backend_err)
    }

    /// Pages of `table` from `start`, each handed to `f` until it says stop.
    fn pages(
        &self,
        table: Table,
        prefix: &[u8],
        span: (&[u8], Option<&[u8]>),
        mut f: impl FnMut(&[u8], &[u8]) -> Result<Option<Vec<u8>>, BackendError>,
    ) -> Result<(), BackendError> {
        let whole = engine_key(table, prefix);
        let (from, to) = span;
        let mut start = (from > prefix).then(|| engine_key(table, from));
        let end = to.map(|t| engine_key(table, t));
        let (least, most) = page_len(table);
        let mut limit = match (table, &start) {
            (Table::Manifests, _) | (_, None) => least,
            _ => self.grown.load(Ordering::Relaxed).clamp(least, most),
        };
        loop {
            let (w, s, e) = (whole.clone(), start.clone(), end.clone());
            let page = self.call(move |en| {
                Box::pin(async move {
                    match e {
                        Some(e) => en.range_before(&w, s.as_deref(), &e, limit).await,
                        None => en.range(&w, s.as_deref(), limit).await,
                    }
                })
            })?;
            let bytes: usize = page
                .entries
                .iter()
                .map(|en| en.key.len() + en.value.len())
                .sum();
            limit = if bytes <= SMALL_PAGE {
                (limit * 2).min(most)
            } else {
                (limit / 2).max(least)
            };
            if table != Table::Manifests {
                self.grown.store(limit, Ordering::Relaxed);
            }
            let mut jump = None;
            for en in &page.entries {
                // Every key of the page carries the table's tag.
                if let Some(next) = f(&en.key[1..], &en.value)? {
                    jump = Some(next);
                    break;
                }
            }
            start = match jump {
                Some(j) if j.is_empty() => return Ok(()),
                Some(j) => Some(engine_key(table, &j)),
                None => match page.next_start() {
                    Some(s) => Some(s),
                    None => return Ok(()),
                },
            };
        }
    }

    /// Sends `txns` in order, until one fails; what each applied one wrote goes to `applied`
    /// where it is asked for (the owner's memory; a copy of each write otherwise not made).
    /// A fenced transaction whose compare fails was refused because another replica owns the
    /// store now (nothing else compares): the fence is broken, and this replica writes no more.
    fn send(&self, txns: Vec<Txn>, mut applied: Option<&mut Applied>) -> Result<(), BackendError> {
        for txn in txns {
            let engine = self.engine.clone();
            let writes = applied.is_some().then(|| txn.writes.clone());
            match on(&self.bridge, async move { engine.txn(txn).await }) {
                Ok(_) => {
                    if let (Some(applied), Some(writes)) = (applied.as_deref_mut(), writes) {
                        applied.extend(writes.into_iter().map(|w| match w {
                            Write::Put { key, value } => (key, Some(value)),
                            Write::Delete { key } => (key, None),
                        }));
                    }
                }
                Err(EngineError::Conflict) if self.fence.is_some() => {
                    if let Some(f) = &self.fence {
                        f.broke();
                    }
                    return Err(backend_err(EngineError::NotOwner(
                        "another replica took the store over".into(),
                    )));
                }
                Err(e) => return Err(backend_err(e)),
            }
        }
        Ok(())
    }

    /// The changes, packed in order into transactions within the engine's limits. A key a
    /// later change writes again takes that write in the transaction it is in (etcd refuses a
    /// key twice in one): the state after the transaction is the state after the changes one
    /// by one, and a batch of publishes into one directory (each touching the directory) is a
    /// few transactions, not one each.
    ///
    /// With a `fence`, every transaction compares it too (its bytes counted in the limits).
    fn pack(changes: Vec<Vec<Op>>, fence: Option<&Compare>) -> Result<Vec<Txn>, EngineError> {
        let new_txn = || Txn {
            compares: fence.into_iter().cloned().collect(),
            writes: Vec::new(),
        };
        let fence_bytes = fence.map_or(0, |c| c.key.len() + OP_OVERHEAD);
        let mut txns = Vec::new();
        let mut txn = new_txn();
        let mut at: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut bytes = fence_bytes;
        for change in changes {
            let mut alone = new_txn();
            for op in change {
                alone = match op {
                    Op::Put(t, k, v) => alone.put(engine_key(t, &k), v),
                    Op::Delete(t, k) => alone.delete(engine_key(t, &k)),
                };
            }
            // A change that writes a key twice keeps its last write, as a batch does.
            dedup_last(&mut alone);
            alone.check()?;
            let alone_bytes = alone.size() - fence_bytes;
            let new_keys = alone
                .writes
                .iter()
                .filter(|w| !at.contains_key(w.key()))
                .count();
            let replaced: usize = alone
                .writes
                .iter()
                .filter_map(|w| at.get(w.key()))
                .map(|&i| txn.writes[i].size())
                .sum();
            let grown = bytes - replaced + alone_bytes;
            if txn.writes.len() + new_keys > MAX_TXN_OPS || grown > MAX_TXN_BYTES {
                txns.push(std::mem::replace(&mut txn, new_txn()));
                at.clear();
                bytes = fence_bytes;
            }
            bytes += alone_bytes;
            for w in alone.writes {
                match at.get(w.key()) {
                    Some(&i) => {
                        bytes -= txn.writes[i].size();
                        txn.writes[i] = w;
                    }
                    None => {
                        at.insert(w.key().to_vec(), txn.writes.len());
                        txn.writes.push(w);
                    }
                }
            }
        }
        if !txn.writes.is_empty() {
            txns.push(txn);
        }
        Ok(txns)
    }
}

/// Keeps the last write of each key, in the order of those last writes.
fn dedup_last(txn: &mut Txn) {
    let mut seen = std::collections::HashSet::new();
    let mut kept: Vec<_> = txn
        .writes
        .drain(..)
        .rev()
        .filter(|w| seen.insert(w.key().to_vec()))
        .collect();
    kept.reverse();
    txn.writes = kept;
}

/// Runs `fut` on the bridge's runtime and waits for it on this thread, whatever thread that is.
fn on<T: Send + 'static>(
    bridge: &Bridge,
    fut: impl Future<Output = Result<T, EngineError>> + Send + 'static,
) -> Result<T, EngineError> {
    bridge
        .run(fut)
        .ok_or_else(|| EngineError::Unavailable("the metadata engine's runtime stopped".into()))?
}

impl MetaBackend for EngineTables {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, BackendError> {
        let key = engine_key(table, key);
        let owned = self.claim().filter(|_| remembered(&key));
        let known = owned.map(|claim| self.owned.get(claim, &key));
        let ticket = match known {
            Some(Lookup::Known(value)) => return Ok(value),
            Some(Lookup::Read(ticket)) => Some(ticket),
            None => None,
        };
        let asked = key.clone();
        let entry = self.call(move |e| Box::pin(async move { e.get(&asked).await }))?;
        let value = entry.map(|en| en.value);
        if let Some(t) = ticket {
            self.owned.fill(t, &key, value.as_deref());
        }
        Ok(value)
    }

    fn scan_prefix(&self, table: Table, prefix: &[u8]) -> Result<Vec<KeyValue>, BackendError> {
        let mut out = Vec::new();
        self.pages(table, prefix, (prefix, None), |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            Ok(None)
        })?;
        Ok(out)
    }

    fn for_each(&self, table: Table, f: &mut Visit<'_>) -> Result<(), BackendError> {
        self.pages(table, b"", (b"", None), |k, v| f(k, v).map(|()| None))
    }

    fn walk_from(
        &self,
        table: Table,
        prefix: &[u8],
        span: (&[u8], Option<&[u8]>),
        f: &mut dyn FnMut(&[u8], &[u8]) -> Step,
    ) -> Result<(), BackendError> {
        self.pages(table, prefix, span, |k, v| {
            Ok(match f(k, v) {
                Step::Next => None,
                // An empty start stops the walk: nothing comes after an all-0xff prefix.
                Step::Past(n) => Some(prefix_end(&k[..n.min(k.len())]).unwrap_or_default()),
                Step::Stop => Some(Vec::new()),
            })
        })
    }

    fn write(&self, ops: Vec<Op>) -> Result<(), BackendError> {
        self.commit(vec![ops])
    }

    fn write_synced(&self, ops: Vec<Op>) -> Result<(), BackendError> {
        self.commit(vec![ops])
    }

    /// Unfenced: a replica that stands by writes these too. Each op a change of its own.
    fn write_shared(&self, ops: Vec<Op>) -> Result<(), BackendError> {
        let changes = ops.into_iter().map(|op| vec![op]).collect();
        self.send(Self::pack(changes, None).map_err(backend_err)?, None)
    }

    fn flush(&self) -> Result<(), BackendError> {
        // Every transaction was durable when it returned.
        Ok(())
    }

    fn check(&self) -> Result<(), BackendError> {
        self.call(|e| Box::pin(async move { e.revision().await.map(|_| ()) }))
    }

    fn stored_bytes(&self) -> Result<Option<u64>, BackendError> {
        self.call(|e| Box::pin(async move { e.stored_bytes().await }))
    }

    /// Straight from the engine, in one request: the owner's memory is for keys read again,
    /// and these are asked once, for a name about to be written.
    fn read_many(&self, gets: &[(Table, Vec<u8>)], below: Option<(Table, &[u8])>) -> ReadMany {
        let keys: Vec<Vec<u8>> = gets.iter().map(|(t, k)| engine_key(*t, k)).collect();
        let below = below.map(|(t, p)| engine_key(t, p));
        let (found, any) = self
            .call(move |e| Box::pin(async move { e.read_many(&keys, below.as_deref()).await }))?;
        Ok((found.into_iter().map(|e| e.map(|e| e.value)).collect(), any))
    }

    /// Checks every change against the limits before writing any; a transaction that fails
    /// after earlier ones of the batch were written leaves those written (each change whole),
    /// and the batch reports the failure, as a crash between them would.
    fn commit(&self, changes: Vec<Vec<Op>>) -> Result<(), BackendError> {
        let fence = match &self.fence {
            Some(f) => Some(f.compare().map_err(backend_err)?),
            None => None,
        };
        let txns = Self::pack(changes, fence.as_ref()).map_err(backend_err)?;
        let Some(claim) = fence.as_ref().map(|c| c.modified) else {
            return self.send(txns, None);
        };
        let written = txns.iter().flat_map(|t| t.writes.iter().map(Write::key));
        let ticket = self.owned.writing(claim, written.filter(|k| remembered(k)));
        let mut applied = Vec::new();
        let sent = self.send(txns, Some(&mut applied));
        applied.retain(|(k, _)| remembered(k));
        self.owned.written(ticket, applied);
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::engine::counted::Counted;
    use crate::meta::engine::{RocksEngine, OWNER_KEY};

    fn tables() -> (tempfile::TempDir, EngineTables) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let t = EngineTables::connect(move || async move { RocksEngine::open(&path) }).unwrap();
        (dir, t)
    }

    #[test]
    fn the_tables_keep_apart_and_walk_as_the_core_expects() {
        let (_d, t) = tables();
        let mut ops: Vec<Op> = (0..600)
            .map(|i| Op::Put(Table::Keys, format!("ns\0d/{i:03}").into_bytes(), vec![1]))
            .collect();
        ops.push(Op::Put(Table::Attrs, b"ns\0d/000".to_vec(), vec![2]));
        // 601 writes: more than one transaction holds, in one change, is refused whole.
        assert!(t.commit(vec![ops.clone()]).is_err());
        assert!(t.get(Table::Keys, b"ns\0d/000").unwrap().is_none());
        // As many changes of one write each, they pack into a few transactions.
        t.commit(ops.into_iter().map(|o| vec![o]).collect())
            .unwrap();
        assert_eq!(t.scan_prefix(Table::Keys, b"ns\0d/").unwrap().len(), 600);
        assert_eq!(t.scan_prefix(Table::Attrs, b"").unwrap().len(), 1);
        let mut n = 0;
        t.for_each(Table::Keys, &mut |_, _| {
            n += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(n, 600);
        // Past the first 7 bytes ("ns\0d/0N"): one key per ten.
        let mut seen = Vec::new();
        t.walk_prefix(Table::Keys, b"ns\0d/", &mut |k, _| {
            seen.push(k.to_vec());
            Step::Past(7)
        })
        .unwrap();
        assert_eq!(seen.len(), 60);
        assert_eq!(seen[1], b"ns\0d/010");
        // From a key within the prefix: a page of a listing begins there.
        let mut from = Vec::new();
        t.walk_from(Table::Keys, b"ns\0d/", (b"ns\0d/5\0", None), &mut |k, _| {
            from.push(k.to_vec());
            Step::Next
        })
        .unwrap();
        assert_eq!((from.len(), from[0].as_slice()), (100, &b"ns\0d/500"[..]));
        let mut one = 0;
        t.walk_prefix(Table::Keys, b"", &mut |_, _| {
            one += 1;
            Step::Stop
        })
        .unwrap();
        assert_eq!(one, 1);
    }

    /// A batch of publishes into one directory touches the directory in each: the later
    /// writes of it join the transaction the earlier ones are in, so 256 changes make three
    /// transactions (128 writes each at most), not 256, and the directory keeps the last.
    #[test]
    fn changes_that_write_one_key_again_pack_into_few_transactions() {
        let (_d, t) = tables();
        let changes: Vec<Vec<Op>> = (0..256u32)
            .map(|i| {
                vec![
                    Op::Put(Table::Keys, format!("ns\0d/{i:03}").into_bytes(), vec![1]),
                    Op::Put(Table::Attrs, b"ns\0d".to_vec(), i.to_be_bytes().to_vec()),
                ]
            })
            .collect();
        let txns = EngineTables::pack(changes.clone(), None).unwrap();
        assert_eq!(
            txns.len(),
            3,
            "{:?}",
            txns.iter().map(|t| t.writes.len()).collect::<Vec<_>>()
        );
        for txn in &txns {
            txn.check().unwrap();
        }
        t.commit(changes).unwrap();
        assert_eq!(
            t.get(Table::Attrs, b"ns\0d").unwrap().unwrap(),
            255u32.to_be_bytes()
        );
        assert_eq!(t.scan_prefix(Table::Keys, b"ns\0d/").unwrap().len(), 256);
    }

    /// The layout's number is written at the first start; an engine a newer build wrote is
    /// refused at the start, before anything is read or written as this build's layout.
    /// A replica writes only while the owner key is still at its claim: once another claim
    /// replaced it, a batch writes nothing, and the fence stays broken.
    #[test]
    fn a_fenced_replica_writes_only_while_its_claim_stands() {
        let (_dir, t) = tables();
        let fence = Arc::new(Fence::default());
        let t = t.fenced(fence.clone());
        let put = |k: &str| vec![vec![Op::Put(Table::Keys, k.into(), b"v".to_vec())]];
        let err = t.commit(put("standing-by")).unwrap_err();
        assert!(err.to_string().contains("stands by"), "{err}");
        let claim = |who: &'static str| {
            t.call(move |e| Box::pin(async move { e.txn(Txn::new().put(OWNER_KEY, who)).await }))
                .unwrap()
        };
        fence.hold(claim("me"));
        t.commit(put("owned")).unwrap();
        assert!(t.get(Table::Keys, b"owned").unwrap().is_some());
        claim("another replica");
        let err = t.commit(put("deposed")).unwrap_err();
        assert!(err.to_string().contains("took the store over"), "{err}");
        assert!(t.get(Table::Keys, b"deposed").unwrap().is_none());
        assert!(fence.is_broken());
        assert!(t.commit(put("after")).is_err());
    }

    /// The owner keeps in memory what it writes of its tables, but not the block references,
    /// which other replicas write too: one deleted behind its back (a standby's table, here
    /// the engine itself) is read again, and its own writes of them take no memory.
    #[test]
    fn an_owner_keeps_no_block_reference_in_memory() {
        let (_dir, t) = tables();
        let fence = Arc::new(Fence::default());
        let t = t.fenced(fence.clone());
        let claim = t
            .call(|e| Box::pin(async move { e.txn(Txn::new().put(OWNER_KEY, "me")).await }))
            .unwrap();
        fence.hold(claim);
        let write = |table: Table, k: &[u8]| {
            t.commit(vec![vec![Op::Put(table, k.to_vec(), Vec::new())]])
                .unwrap()
        };
        write(Table::Keys, b"key");
        write(Table::BlockRefs, b"ref");
        let known = |table: Table, k: &[u8]| {
            matches!(t.owned.get(claim, &engine_key(table, k)), Lookup::Known(_))
        };
        assert!(known(Table::Keys, b"key"), "the owner's memory is on");
        assert!(!known(Table::BlockRefs, b"ref"));
        let gone = engine_key(Table::BlockRefs, b"ref");
        t.call(move |e| Box::pin(async move { e.txn(Txn::new().delete(gone)).await }))
            .unwrap();
        assert!(t.get(Table::BlockRefs, b"ref").unwrap().is_none());
    }

    #[test]
    fn a_walk_of_small_manifests_grows_its_pages() {
        let dir = tempfile::tempdir().unwrap();
        // A walk reads nothing but pages: each read the engine counts is one.
        let engine = Counted::new(Arc::new(RocksEngine::open(dir.path()).unwrap()));
        let pages = engine.reads.clone();
        let t = EngineTables::connect(move || async move { Ok(engine) }).unwrap();
        let manifest = |i: u32, len: usize| {
            let mut k = [0u8; 32];
            k[..4].copy_from_slice(&i.to_be_bytes());
            Op::Put(Table::Manifests, k.to_vec(), vec![7; len])
        };
        t.commit((0..1000).map(|i| vec![manifest(i, 200)]).collect())
            .unwrap();
        let walk = |t: &EngineTables| {
            let before = pages.load(Ordering::Relaxed);
            let mut n = 0;
            t.walk_prefix(Table::Manifests, b"", &mut |_, _| {
                n += 1;
                Step::Next
            })
            .unwrap();
            (n, pages.load(Ordering::Relaxed) - before)
        };
        let (n, asked) = walk(&t);
        assert_eq!(n, 1000);
        // 4, 8, 16, 32, then 64 a page: 19 pages (250 at 4 a page).
        assert!(asked <= 20, "{asked} pages");
        // Large ones after them: the walk is whole (the page that meets them halves the next).
        t.commit((1000..1040).map(|i| vec![manifest(i, 1 << 20)]).collect())
            .unwrap();
        let (n, _) = walk(&t);
        assert_eq!(n, 1040);
    }

    #[test]
    fn an_engine_a_newer_build_wrote_is_refused_and_an_older_layout_upgraded_at_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let open = |p: std::path::PathBuf| {
            EngineTables::connect(move || async move { RocksEngine::open(&p) })
        };
        let t = open(dir.path().to_path_buf()).unwrap();
        let read = |t: &EngineTables| {
            t.call(|e| Box::pin(async move { e.get(SCHEMA_KEY).await }))
                .unwrap()
                .map(|en| en.value)
        };
        assert_eq!(read(&t), Some(SCHEMA.to_string().into_bytes()));
        // An older layout is brought up to this one at the start.
        t.call(|e| Box::pin(async move { e.txn(Txn::new().put(SCHEMA_KEY, "1")).await }))
            .unwrap();
        drop(t);
        let t = open(dir.path().to_path_buf()).unwrap();
        assert_eq!(read(&t), Some(SCHEMA.to_string().into_bytes()));
        drop(t);
        // Started again, the same build serves it.
        let t = open(dir.path().to_path_buf()).unwrap();
        t.call(|e| Box::pin(async move { e.txn(Txn::new().put(SCHEMA_KEY, "999")).await }))
            .unwrap();
        drop(t);
        match open(dir.path().to_path_buf()) {
            Err(EngineError::Schema(m)) => assert!(m.contains("newer ktfs"), "{m}"),
            other => panic!("a newer layout was served: {:?}", other.err()),
        }
    }

    #[test]
    fn a_change_that_writes_a_key_twice_keeps_the_last_write() {
        let (_d, t) = tables();
        t.write_synced(vec![
            Op::Put(Table::Keys, b"k".to_vec(), b"1".to_vec()),
            Op::Delete(Table::Keys, b"k".to_vec()),
            Op::Put(Table::Keys, b"k".to_vec(), b"2".to_vec()),
        ])
        .unwrap();
        assert_eq!(t.get(Table::Keys, b"k").unwrap().unwrap(), b"2");
        // Two changes of one batch that write the same key: the later one wins.
        t.commit(vec![
            vec![Op::Put(Table::Keys, b"k".to_vec(), b"3".to_vec())],
            vec![Op::Put(Table::Keys, b"k".to_vec(), b"4".to_vec())],
        ])
        .unwrap();
        assert_eq!(t.get(Table::Keys, b"k").unwrap().unwrap(), b"4");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn called_from_an_async_thread_it_answers_and_drops_without_a_panic() {
        let (_d, t) = tables();
        t.write(vec![Op::Put(Table::Manifests, b"v".to_vec(), vec![9; 10])])
            .unwrap();
        assert_eq!(t.get(Table::Manifests, b"v").unwrap().unwrap().len(), 10);
        drop(t);
    }
}
