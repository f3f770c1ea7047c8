//! The metadata's tables on an engine: each table a one-byte prefix of the engine's keyspace,
//! served to the synchronous core (`MetaBackend`, which plans under its write lock on blocking
//! threads) by a runtime of its own, so a call blocks only its caller's thread, from whatever
//! thread it comes. Group commit's batch becomes as few transactions as the engine's limits
//! hold, each change whole in one of them.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::fence::{claim_key, Fence};
use super::owned::{Applied, Lookup, OwnedReads, Scope};
use super::seam::{
    prefix_end, Compare, EngineError, MetaEngine, Revision, Txn, Write, MAX_TXN_BYTES, MAX_TXN_OPS,
    OP_OVERHEAD,
};
use super::shards::shard_of;
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
pub(super) const SCHEMA_KEY: &[u8] = b"schema";

/// Where the number of shards the store's namespaces fall into lies (absent: 1, the store
/// owned whole). Fixed while any replica serves: replicas that counted shards differently
/// would each fence a namespace's rows by a claim of their own.
pub(super) const SHARDS_KEY: &[u8] = b"shards";

/// The most shards a store may have: a transaction compares one claim for each shard it
/// writes, within etcd's operations a transaction.
pub const MAX_SHARDS: u32 = 1024;

/// The number a key beside the tables holds (the layout, the shard count), written as text.
fn number_in(value: &[u8]) -> Option<u32> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// The store's shards, settled with what this replica was asked for (`wanted`; `None`: as
/// the store has them). A store's count is written once, while no replica owns it whole.
async fn settle_shards(engine: &dyn MetaEngine, wanted: Option<u32>) -> Result<u32, EngineError> {
    let stored = match engine.get(SHARDS_KEY).await? {
        Some(e) => Some(
            number_in(&e.value)
                .filter(|n| (1..=MAX_SHARDS).contains(n))
                .ok_or_else(|| {
                    EngineError::Schema(format!(
                        "the store's shard count is {:?}, not a number from 1 to {MAX_SHARDS}",
                        String::from_utf8_lossy(&e.value)
                    ))
                })?,
        ),
        None => None,
    };
    match (stored, wanted) {
        (Some(n), None) => Ok(n),
        (None, None | Some(1)) => Ok(1),
        (Some(n), Some(w)) if n == w => Ok(n),
        (Some(n), Some(w)) => Err(EngineError::Schema(format!(
            "the store's namespaces fall into {n} shards, not the {w} asked for: every replica \
             serves the count the store was made with"
        ))),
        (None, Some(w)) if w > MAX_SHARDS => Err(EngineError::Schema(format!(
            "{w} shards asked for; a store has at most {MAX_SHARDS}"
        ))),
        (None, Some(w)) => {
            // Only where no replica owns the store whole, which would go on fencing every
            // namespace by its one claim.
            let set = Txn::new()
                .when_modified_at(SHARDS_KEY, 0)
                .when_modified_at(super::fence::OWNER_KEY, 0)
                .put(SHARDS_KEY, w.to_string());
            match engine.txn(set).await {
                Ok(_) => Ok(w),
                Err(EngineError::Conflict) => match engine.get(SHARDS_KEY).await? {
                    Some(_) => Box::pin(settle_shards(engine, wanted)).await,
                    None => Err(EngineError::Schema(
                        "a replica owns the store whole: stop its replicas before dividing its \
                         namespaces into shards"
                            .into(),
                    )),
                },
                Err(e) => Err(e),
            }
        }
    }
}

/// Checks the engine's layout against this build's, writing it where the engine holds none
/// yet (a new prefix, or one a build before the number wrote).
async fn settle_schema(engine: &dyn MetaEngine) -> Result<(), EngineError> {
    let (found, modified) = match engine.get(SCHEMA_KEY).await? {
        Some(e) => number_in(&e.value)
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

/// Which shard's claim fences a write of `key` (an engine key) where the store has `shards`:
/// every write of a store owned whole; a namespace's rows (keys, attributes, inodes: each
/// begins with its namespace) its shard's; what collection buries the first shard's, whose
/// owner collects. Manifests (named by their content), version locations (a node's, written
/// by whichever replica takes its heartbeat), block references and small blocks go unfenced.
fn fenced_by(key: &[u8], shards: u32) -> Option<u32> {
    if shards <= 1 {
        return Some(0);
    }
    let (&t, rest) = key.split_first()?;
    if t == tag(Table::Keys) || t == tag(Table::Attrs) || t == tag(Table::Inodes) {
        let ns = rest.split(|b| *b == 0).next().unwrap_or_default();
        return Some(shard_of(ns, shards));
    }
    (t == tag(Table::Graveyard)).then_some(0)
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
    /// Where several replicas may serve the engine, the claims every write must still hold.
    fence: Option<Arc<Fence>>,
    /// How many shards the store's namespaces fall into.
    shards: u32,
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
        let at = engine.clone();
        let shards = on(
            &bridge,
            async move { settle_shards(at.as_ref(), None).await },
        )?;
        Ok(EngineTables {
            grown: AtomicUsize::new(page_len(Table::Keys).0),
            engine,
            bridge,
            fence: None,
            shards,
            owned: OwnedReads::default(),
        })
    }

    /// Divides the store's namespaces into `wanted` shards where it is new to them, or checks
    /// that it has that many.
    pub fn with_shards(mut self, wanted: u32) -> Result<Self, EngineError> {
        let at = self.engine.clone();
        self.shards = on(&self.bridge, async move {
            settle_shards(at.as_ref(), Some(wanted)).await
        })?;
        if let Some(f) = &self.fence {
            f.set_shards(self.shards);
        }
        Ok(self)
    }

    /// How many shards the store's namespaces fall into (1: the store is owned whole).
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// Writes only while `fence` holds: a replica writes only the rows of what it owns.
    pub fn fenced(mut self, fence: Arc<Fence>) -> Self {
        fence.set_shards(self.shards);
        self.fence = Some(fence);
        self
    }

    /// The claim this replica holds over `key` (an engine key), under which its memory of
    /// the key answers, if it holds one.
    fn scope(&self, key: &[u8]) -> Option<Scope> {
        let fence = self.fence.as_ref()?;
        if !remembered(key) {
            return None;
        }
        let shard = fenced_by(key, self.shards)?;
        fence.revision(shard).map(|rev| (shard, rev))
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
            let compares = txn.compares.clone();
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
                    return Err(backend_err(self.lost_claims(&compares)));
                }
                Err(e) => return Err(backend_err(e)),
            }
        }
        Ok(())
    }

    /// A fenced transaction was refused: of the claims it compared (`compares`), those found
    /// changed are lost; of a store owned whole, its one claim (nothing else compares).
    fn lost_claims(&self, compares: &[Compare]) -> EngineError {
        let Some(fence) = &self.fence else {
            return EngineError::Conflict;
        };
        if self.shards <= 1 {
            fence.broke();
            return EngineError::NotOwner("another replica took the store over".into());
        }
        let keys: Vec<Vec<u8>> = compares.iter().map(|c| c.key.clone()).collect();
        let now = self.call(move |e| {
            Box::pin(async move {
                let mut revs = Vec::with_capacity(keys.len());
                for k in keys {
                    revs.push(e.get(&k).await?.map_or(0, |en| en.modified));
                }
                Ok(revs)
            })
        });
        // Unread, the claims stay as held: the election's next look says where they stand.
        if let Ok(revs) = now {
            for (c, rev) in compares.iter().zip(revs) {
                if rev != c.modified {
                    fence.lost_claim(c);
                }
            }
        }
        EngineError::NotOwner("another replica claimed a shard this change writes".into())
    }

    /// The changes, packed in order into transactions within the engine's limits. A key a
    /// later change writes again takes that write in the transaction it is in (etcd refuses a
    /// key twice in one): the state after the transaction is the state after the changes one
    /// by one, and a batch of publishes into one directory (each touching the directory) is a
    /// few transactions, not one each.
    ///
    /// With a `fence`, each transaction compares the claim of every shard whose rows it
    /// writes (their bytes counted in the limits); a change of a shard this replica does not
    /// hold refuses the whole batch before anything is sent.
    fn pack(&self, changes: Vec<Vec<Op>>, fence: Option<&Fence>) -> Result<Vec<Txn>, EngineError> {
        let mut txns = Vec::new();
        let mut txn = Txn::new();
        let mut at: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut bytes = 0;
        for change in changes {
            let mut alone = Txn::new();
            for op in change {
                alone = match op {
                    Op::Put(t, k, v) => alone.put(engine_key(t, &k), v),
                    Op::Delete(t, k) => alone.delete(engine_key(t, &k)),
                };
            }
            // A change that writes a key twice keeps its last write, as a batch does.
            dedup_last(&mut alone);
            if let Some(f) = fence {
                let shards: BTreeSet<u32> = alone
                    .writes
                    .iter()
                    .filter_map(|w| fenced_by(w.key(), self.shards))
                    .collect();
                alone.compares = shards
                    .into_iter()
                    .map(|s| f.compare(s))
                    .collect::<Result<_, _>>()?;
            }
            alone.check()?;
            let compare_bytes =
                |cs: &[&Compare]| -> usize { cs.iter().map(|c| c.key.len() + OP_OVERHEAD).sum() };
            let new_compares: Vec<&Compare> = alone
                .compares
                .iter()
                .filter(|c| !txn.compares.contains(c))
                .collect();
            let alone_bytes: usize = alone.writes.iter().map(Write::size).sum();
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
            let grown = bytes - replaced + alone_bytes + compare_bytes(&new_compares);
            let new_compares = if txn.writes.len() + new_keys > MAX_TXN_OPS
                || txn.compares.len() + new_compares.len() > MAX_TXN_OPS
                || grown > MAX_TXN_BYTES
            {
                txns.push(std::mem::take(&mut txn));
                at.clear();
                bytes = 0;
                alone.compares.iter().collect()
            } else {
                new_compares
            };
            bytes += alone_bytes + compare_bytes(&new_compares);
            let added: Vec<Compare> = new_compares.into_iter().cloned().collect();
            txn.compares.extend(added);
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
        let known = self.scope(&key).map(|scope| self.owned.get(scope, &key));
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
        self.send(self.pack(changes, None).map_err(backend_err)?, None)
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
        let txns = self
            .pack(changes, self.fence.as_deref())
            .map_err(backend_err)?;
        if self.fence.is_none() {
            return self.send(txns, None);
        }
        // What was written is kept under the claims the transactions compared.
        let claims: HashMap<Vec<u8>, Revision> = txns
            .iter()
            .flat_map(|t| t.compares.iter().map(|c| (c.key.clone(), c.modified)))
            .collect();
        let shards = self.shards;
        let scope_of = |k: &[u8]| -> Option<Scope> {
            let shard = fenced_by(k, shards).filter(|_| remembered(k))?;
            claims
                .get(&claim_key(shard, shards))
                .map(|rev| (shard, *rev))
        };
        let written = txns.iter().flat_map(|t| t.writes.iter().map(Write::key));
        let ticket = self.owned.writing(written.filter(|k| remembered(k)));
        let mut applied = Vec::new();
        let sent = self.send(txns, Some(&mut applied));
        self.owned.written(ticket, applied, scope_of);
        sent
    }
}

#[cfg(test)]
mod tests;
