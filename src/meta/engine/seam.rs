//! The engine's seam: the trait every metadata engine implements, what it reads and writes, its
//! limits and its errors.

/// The revision of the transaction that last wrote an entry; `0` for an entry that is absent.
/// Revisions only grow.
pub type Revision = i64;

/// The most operations one transaction may hold (etcd's `--max-txn-ops` default), compares and
/// writes each counted on their own.
pub const MAX_TXN_OPS: usize = 128;

/// The most bytes of keys and values one transaction may carry, under etcd's default
/// `--max-request-bytes` (1.5 MiB) with room for the request's own framing.
pub const MAX_TXN_BYTES: usize = (3 << 19) - (16 << 10);

/// What a transaction or a page counts for each operation beyond its key and value: the
/// framing an etcd request adds, so that a transaction RocksDB takes fits etcd too.
pub(super) const OP_OVERHEAD: usize = 16;

/// One entry as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// The revision that last wrote it.
    pub modified: Revision,
}

/// A page of a prefix, in key order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Page {
    pub entries: Vec<Entry>,
    /// Whether entries of the prefix follow the last one of this page.
    pub more: bool,
    /// The engine's revision when the page was read.
    pub revision: Revision,
}

impl Page {
    /// Where the next page starts: just after this page's last key, when there is more.
    pub fn next_start(&self) -> Option<Vec<u8>> {
        match self.more {
            true => self.entries.last().map(|e| just_after(&e.key)),
            false => None,
        }
    }
}

/// The first key after `key`: itself followed by a zero byte.
pub fn just_after(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.extend_from_slice(key);
    k.push(0);
    k
}

/// A condition of a transaction: the entry at `key` was last written at `modified` (`0`: the
/// entry is absent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    pub key: Vec<u8>,
    pub modified: Revision,
}

/// One write of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    Put { key: Vec<u8>, value: Vec<u8> },
    Delete { key: Vec<u8> },
}

impl Write {
    pub(super) fn key(&self) -> &[u8] {
        match self {
            Write::Put { key, .. } | Write::Delete { key } => key,
        }
    }

    /// The bytes the write carries, as the limits count them.
    pub(super) fn size(&self) -> usize {
        match self {
            Write::Put { key, value } => key.len() + value.len() + OP_OVERHEAD,
            Write::Delete { key } => key.len() + OP_OVERHEAD,
        }
    }
}

/// Writes applied together, all or none, and only if every compare holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub writes: Vec<Write>,
}

impl Txn {
    pub fn new() -> Self {
        Txn::default()
    }

    /// Applies only if `key` was last written at `modified` (`0`: is absent).
    pub fn when_modified_at(mut self, key: impl Into<Vec<u8>>, modified: Revision) -> Self {
        self.compares.push(Compare {
            key: key.into(),
            modified,
        });
        self
    }

    pub fn put(mut self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        self.writes.push(Write::Put {
            key: key.into(),
            value: value.into(),
        });
        self
    }

    pub fn delete(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.writes.push(Write::Delete { key: key.into() });
        self
    }

    /// The bytes the transaction carries, as the limits count them.
    pub fn size(&self) -> usize {
        let compares: usize = self
            .compares
            .iter()
            .map(|c| c.key.len() + OP_OVERHEAD)
            .sum();
        let writes: usize = self.writes.iter().map(Write::size).sum();
        compares + writes
    }

    /// Refuses a transaction over the limits every engine keeps, and one that writes a key
    /// twice (etcd refuses it: "duplicate key given in txn request").
    pub fn check(&self) -> Result<(), EngineError> {
        let bytes = self.size();
        let ops = self.compares.len().max(self.writes.len());
        if ops > MAX_TXN_OPS || bytes > MAX_TXN_BYTES {
            return Err(EngineError::TooLarge {
                compares: self.compares.len(),
                writes: self.writes.len(),
                bytes,
            });
        }
        let mut keys: Vec<&[u8]> = self.writes.iter().map(Write::key).collect();
        keys.sort_unstable();
        if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
            return Err(EngineError::DuplicateKey(
                String::from_utf8_lossy(w[0]).into(),
            ));
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A compare failed: what was read has changed since. Nothing was written.
    #[error("the metadata changed since it was read; nothing was written")]
    Conflict,
    #[error(
        "a metadata transaction of {compares} compares, {writes} writes and {bytes} bytes is \
         over the engine's limits ({MAX_TXN_OPS} operations, {MAX_TXN_BYTES} bytes)"
    )]
    TooLarge {
        compares: usize,
        writes: usize,
        bytes: usize,
    },
    #[error("a metadata transaction writes the key {0:?} twice")]
    DuplicateKey(String),
    #[error("the metadata engine is out of space: {0}")]
    NoSpace(String),
    #[error("the metadata engine cannot be reached: {0}")]
    Unavailable(String),
    /// The engine holds a layout this server cannot serve.
    #[error("{0}")]
    Schema(String),
    /// This replica does not own the store (it stands by, or another replica took it over):
    /// nothing was written.
    #[error("this replica does not own the store's metadata: {0}; nothing was written")]
    NotOwner(String),
    #[error("the metadata engine: {0}")]
    Other(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl EngineError {
    pub fn other(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        EngineError::Other(Box::new(e))
    }
}

/// A metadata engine. Each call is one request to it: a read sees every transaction that
/// returned before it began (etcd's linearizable reads; RocksDB's one process), and a
/// transaction is durable when it returns.
#[async_trait::async_trait]
pub trait MetaEngine: Send + Sync + 'static {
    /// The entry at `key`.
    async fn get(&self, key: &[u8]) -> Result<Option<Entry>, EngineError>;

    /// Up to `limit` entries whose keys start with `prefix`, in key order, from the first key
    /// at or after `start` (from the first of the prefix without one). A listing of any size
    /// is read page by page ([`Page::next_start`]), never as one answer.
    async fn range(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        limit: usize,
    ) -> Result<Page, EngineError>;

    /// As [`MetaEngine::range`], with no key at or after `end`: an engine that counts what a
    /// whole range holds to answer a page of it (etcd, up to 3.6, visits every key to the
    /// range's end) reads no further than the caller needs.
    async fn range_before(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        end: &[u8],
        limit: usize,
    ) -> Result<Page, EngineError> {
        let mut page = self.range(prefix, start, limit).await?;
        if let Some(i) = page.entries.iter().position(|e| e.key.as_slice() >= end) {
            page.entries.truncate(i);
            page.more = false;
        }
        Ok(page)
    }

    /// Applies `txn` if its compares hold ([`EngineError::Conflict`] if not); returns the
    /// revision it wrote at.
    async fn txn(&self, txn: Txn) -> Result<Revision, EngineError>;

    /// Deletes every entry whose key starts with `prefix`, at once; returns the revision.
    async fn delete_range(&self, prefix: &[u8]) -> Result<Revision, EngineError>;

    /// The engine's current revision.
    async fn revision(&self) -> Result<Revision, EngineError>;

    /// The entries at `keys`, and whether any key starts with `below` (where given): in one
    /// request where the engine can (etcd: one transaction of reads). A publish of a new name
    /// asks three such questions (its key, its attributes, keys below it), each otherwise a
    /// round trip.
    async fn read_many(
        &self,
        keys: &[Vec<u8>],
        below: Option<&[u8]>,
    ) -> Result<(Vec<Option<Entry>>, bool), EngineError> {
        let mut found = Vec::with_capacity(keys.len());
        for k in keys {
            found.push(self.get(k).await?);
        }
        let any = match below {
            Some(p) => !self.range(p, None, 1).await?.entries.is_empty(),
            None => false,
        };
        Ok((found, any))
    }

    /// How many bytes the engine's database takes, where that is bounded by a quota (etcd's
    /// `--quota-backend-bytes`, past which it refuses every write): `None` where it is not.
    async fn stored_bytes(&self) -> Result<Option<u64>, EngineError> {
        Ok(None)
    }
}

/// The first key after every key that starts with `prefix` (`None`: no such key, the prefix
/// being empty or all `0xff`).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}
