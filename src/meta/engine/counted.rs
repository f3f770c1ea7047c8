//! An engine for unit tests: RocksDB (which several stores may share, as replicas share one
//! etcd), counting the requests that read it and the transactions it is sent, and saying how
//! large its database is where a test gives it a size, as etcd says.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{EngineError, Entry, MetaEngine, Page, Revision, RocksEngine, Txn};

#[derive(Clone)]
pub struct Counted {
    inner: Arc<RocksEngine>,
    /// Requests that read: a `get`, a page of a range, a `read_many` (one request).
    pub reads: Arc<AtomicUsize>,
    pub txns: Arc<AtomicUsize>,
    size: Option<u64>,
}

impl Counted {
    pub fn new(inner: Arc<RocksEngine>) -> Self {
        Counted {
            inner,
            reads: Arc::default(),
            txns: Arc::default(),
            size: None,
        }
    }

    /// The same engine, saying its database takes `bytes`.
    pub fn with_size(mut self, bytes: u64) -> Self {
        self.size = Some(bytes);
        self
    }

    fn read(&self) {
        self.reads.fetch_add(1, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl MetaEngine for Counted {
    async fn get(&self, key: &[u8]) -> Result<Option<Entry>, EngineError> {
        self.read();
        self.inner.get(key).await
    }

    async fn range(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        limit: usize,
    ) -> Result<Page, EngineError> {
        self.read();
        self.inner.range(prefix, start, limit).await
    }

    async fn read_many(
        &self,
        keys: &[Vec<u8>],
        below: Option<&[u8]>,
    ) -> Result<(Vec<Option<Entry>>, bool), EngineError> {
        self.read();
        self.inner.read_many(keys, below).await
    }

    async fn txn(&self, txn: Txn) -> Result<Revision, EngineError> {
        self.txns.fetch_add(1, Ordering::SeqCst);
        self.inner.txn(txn).await
    }

    async fn delete_range(&self, prefix: &[u8]) -> Result<Revision, EngineError> {
        self.inner.delete_range(prefix).await
    }

    async fn revision(&self) -> Result<Revision, EngineError> {
        self.inner.revision().await
    }

    async fn stored_bytes(&self) -> Result<Option<u64>, EngineError> {
        Ok(self.size)
    }
}
