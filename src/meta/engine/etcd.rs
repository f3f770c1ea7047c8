//! etcd as a metadata engine: every key under one prefix of the cluster's keyspace (so several
//! stores, or a store and other users, share one etcd), reads linearizable, transactions as
//! etcd's own compare-and-swap on modification revisions.

use etcd_client::{Client, Compare, CompareOp, DeleteOptions, GetOptions, KvClient, TxnOp};

use super::etcd_url::EtcdUrl;
use super::members::{header_revision, Members};
use super::seam::{prefix_end, EngineError, Entry, MetaEngine, Page, Revision, Txn, Write};

/// A connection to an etcd cluster, and the prefix this store's keys live under.
/// The largest answer taken from etcd (tonic's default is 4 MiB).
const MAX_ANSWER: usize = 128 << 20;

#[derive(Clone)]
pub struct EtcdEngine {
    members: std::sync::Arc<Members>,
    prefix: Vec<u8>,
}

/// A read's or a transaction's KV client on `c`: a page of up to 4,096 keys of up to 16 KiB
/// each, with their records, is taken whole.
fn kv(c: Client) -> KvClient {
    c.kv_client().max_decoding_message_size(MAX_ANSWER)
}

impl EtcdEngine {
    pub async fn connect(url: &EtcdUrl) -> Result<Self, EngineError> {
        let engine = EtcdEngine {
            members: std::sync::Arc::new(Members::new(url)),
            prefix: url.prefix.as_bytes().to_vec(),
        };
        // The client connects lazily: one request now, so a server whose etcd cannot be
        // reached says so at its start rather than with its first publish.
        engine.revision().await?;
        engine.members.learn_term().await;
        Ok(engine)
    }

    /// A page of `prefix` from `start`, before `end` where given: etcd counts every key of
    /// the range it is asked for, so a bound keeps a page's cost to what it needs.
    async fn range_to(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Page, EngineError> {
        let whole = self.full(prefix);
        let start = match start {
            Some(s) => self.full(s).max(whole.clone()),
            None => whole.clone(),
        };
        // The store's prefix ends in '/', so the end of a non-empty prefix always exists.
        let mut end_of = prefix_end(&whole).unwrap_or_else(|| vec![0]);
        if let Some(e) = end {
            end_of = end_of.min(self.full(e));
        }
        let end = end_of;
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        let opts = GetOptions::new().with_range(end).with_limit(limit);
        let resp = self
            .members
            .read(|c| {
                let (start, opts) = (start.clone(), opts.clone());
                async move { kv(c).get(start, Some(opts)).await }
            })
            .await?;
        let entries = resp
            .kvs()
            .iter()
            .map(|kv| self.entry(kv))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Page {
            entries,
            more: resp.more(),
            revision: header_revision(resp.header()),
        })
    }

    fn full(&self, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(key);
        k
    }

    fn entry(&self, kv: &etcd_client::KeyValue) -> Result<Entry, EngineError> {
        let key = kv
            .key()
            .strip_prefix(&self.prefix[..])
            .ok_or_else(|| EngineError::Other("etcd answered a key outside the prefix".into()))?;
        Ok(Entry {
            key: key.to_vec(),
            value: kv.value().to_vec(),
            modified: kv.mod_revision(),
        })
    }
}

#[async_trait::async_trait]
impl MetaEngine for EtcdEngine {
    async fn get(&self, key: &[u8]) -> Result<Option<Entry>, EngineError> {
        let key = self.full(key);
        let resp = self
            .members
            .read(|c| {
                let key = key.clone();
                async move { kv(c).get(key, None).await }
            })
            .await?;
        resp.kvs().first().map(|kv| self.entry(kv)).transpose()
    }

    async fn range(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        limit: usize,
    ) -> Result<Page, EngineError> {
        self.range_to(prefix, start, None, limit).await
    }

    async fn range_before(
        &self,
        prefix: &[u8],
        start: Option<&[u8]>,
        end: &[u8],
        limit: usize,
    ) -> Result<Page, EngineError> {
        self.range_to(prefix, start, Some(end), limit).await
    }

    async fn txn(&self, txn: Txn) -> Result<Revision, EngineError> {
        txn.check()?;
        let compares: Vec<Compare> = txn
            .compares
            .iter()
            .map(|c| Compare::mod_revision(self.full(&c.key), CompareOp::Equal, c.modified))
            .collect();
        let ops: Vec<TxnOp> = txn
            .writes
            .into_iter()
            .map(|w| match w {
                Write::Put { key, value } => TxnOp::put(self.full(&key), value, None),
                Write::Delete { key } => TxnOp::delete(self.full(&key), None),
            })
            .collect();
        let txn = etcd_client::Txn::new().when(compares).and_then(ops);
        let resp = self
            .members
            .write(|c| {
                let txn = txn.clone();
                async move { kv(c).txn(txn).await }
            })
            .await?;
        match resp.succeeded() {
            true => Ok(header_revision(resp.header())),
            false => Err(EngineError::Conflict),
        }
    }

    async fn delete_range(&self, prefix: &[u8]) -> Result<Revision, EngineError> {
        let whole = self.full(prefix);
        let end = prefix_end(&whole).unwrap_or_else(|| vec![0]);
        let opts = DeleteOptions::new().with_range(end);
        let resp = self
            .members
            .write(|c| {
                let (whole, opts) = (whole.clone(), opts.clone());
                async move { kv(c).delete(whole, Some(opts)).await }
            })
            .await?;
        Ok(header_revision(resp.header()))
    }

    async fn revision(&self) -> Result<Revision, EngineError> {
        // A count-only read of one key answers with the cluster's revision and no data.
        let opts = GetOptions::new().with_count_only();
        let resp = self
            .members
            .read(|c| {
                let (key, opts) = (self.prefix.clone(), opts.clone());
                async move { kv(c).get(key, Some(opts)).await }
            })
            .await?;
        Ok(header_revision(resp.header()))
    }

    async fn read_many(
        &self,
        keys: &[Vec<u8>],
        below: Option<&[u8]>,
    ) -> Result<(Vec<Option<Entry>>, bool), EngineError> {
        let mut ops: Vec<TxnOp> = keys
            .iter()
            .map(|k| TxnOp::get(self.full(k), None))
            .collect();
        if let Some(p) = below {
            let whole = self.full(p);
            // The store's prefix ends in '/': the end of a non-empty prefix exists.
            let end = prefix_end(&whole).unwrap_or_else(|| vec![0]);
            let opts = GetOptions::new()
                .with_range(end)
                .with_limit(1)
                .with_keys_only();
            ops.push(TxnOp::get(whole, Some(opts)));
        }
        // No compares: etcd answers every read of it at one revision, linearizable.
        let txn = etcd_client::Txn::new().and_then(ops);
        let resp = self
            .members
            .read(|c| {
                let txn = txn.clone();
                async move { kv(c).txn(txn).await }
            })
            .await?;
        let mut found = Vec::with_capacity(keys.len());
        let mut any = false;
        for (i, answer) in resp.op_responses().iter().enumerate() {
            let etcd_client::TxnOpResponse::Get(got) = answer else {
                return Err(EngineError::Other(
                    "etcd answered a read with a write".into(),
                ));
            };
            match i < keys.len() {
                true => found.push(got.kvs().first().map(|kv| self.entry(kv)).transpose()?),
                false => any = !got.kvs().is_empty(),
            }
        }
        if found.len() != keys.len() {
            return Err(EngineError::Other(
                "etcd answered fewer reads than asked".into(),
            ));
        }
        Ok((found, any))
    }

    async fn stored_bytes(&self) -> Result<Option<u64>, EngineError> {
        let status = self
            .members
            .read(|c| async move { c.maintenance_client().status().await })
            .await?;
        // The size allocated, not the size in use: etcd's quota counts the first.
        Ok(u64::try_from(status.db_size()).ok())
    }
}
