//! Where a store server keeps its state ([`StoreSpec`]: its metadata, its blocks and
//! manifests), and the backends those addresses open.

use std::sync::Arc;

use crate::blocks::block_table::BlockTable;
use crate::blocks::ref_table::RefTable;
use crate::db::Db;
use crate::meta::backend::MetaBackend;
use crate::meta::engine::{EngineError, EngineTables, EtcdEngine, EtcdUrl, Fence, ObjectManifests};
use crate::meta::small_blocks::DEFAULT_BUDGET;
use crate::meta::{TableBlocks, TableRefs};
use crate::objects::{ObjectError, ObjectUrl, Objects};

/// What the metadata engine or the object store answered when they were opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Objects(#[from] ObjectError),
}

/// Where a store server keeps its metadata (keys, manifests, attributes, locations).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum MetaSpec {
    /// RocksDB in the data directory: the embedded default.
    #[default]
    Local,
    /// An etcd cluster (`--meta etcd://HOST:PORT[,...]/PREFIX`); blocks stay in the data
    /// directory until they move to an object store (doc/cluster.md).
    Etcd(EtcdUrl),
}

/// Where a store server keeps its state: its metadata, and its blocks and manifests (an object
/// store, or with `None` its data directory and its metadata).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreSpec {
    pub meta: MetaSpec,
    pub blocks: Option<ObjectUrl>,
    /// The size of the metadata's database under which small blocks go into it, where both
    /// engines are remote (`blocks::block_table`); `None`: [`DEFAULT_BUDGET`].
    pub meta_blocks_under: Option<u64>,
    /// How many shards a new store's namespaces fall into, each owned by one replica at a
    /// time; `None`: as the store has them (1 where it is new: owned whole).
    pub shards: Option<u32>,
}

impl std::str::FromStr for MetaSpec {
    type Err = crate::meta::engine::BadEtcdUrl;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(MetaSpec::Etcd)
    }
}

/// The object store `spec` names, if it names one.
pub(super) async fn open_objects(spec: &StoreSpec) -> Result<Option<Arc<Objects>>, OpenError> {
    let Some(url) = spec.blocks.clone() else {
        return Ok(None);
    };
    let objects = tokio::task::spawn_blocking(move || Objects::open(&url))
        .await
        .map_err(EngineError::other)??;
    Ok(Some(Arc::new(objects)))
}

/// What the metadata keeps of the blocks where every replica shares its engine: the
/// namespaces' references, and the small blocks of an object store.
pub(super) struct Shared {
    pub refs: Arc<dyn RefTable>,
    pub blocks: Arc<dyn BlockTable>,
    /// How many shards the store's namespaces fall into (1: owned whole).
    pub shards: u32,
}

/// The metadata backend `spec.meta` names (RocksDB: `db`), its manifests in `objects` if
/// given; on an engine several replicas may serve, writing only while `fence` holds. With it,
/// what of the blocks goes in the engine's tables, which every replica shares (`None`: the
/// blocks' own database, beside the metadata, keeps the references).
pub(super) async fn open_backend(
    spec: &StoreSpec,
    db: Db,
    objects: Option<Arc<Objects>>,
    fence: Option<Arc<Fence>>,
) -> Result<(Box<dyn MetaBackend>, Option<Shared>), OpenError> {
    let tables = match &spec.meta {
        MetaSpec::Local => None,
        MetaSpec::Etcd(url) => {
            let url = url.clone();
            let connect = move || async move { EtcdEngine::connect(&url).await };
            let wanted = spec.shards;
            let tables = tokio::task::spawn_blocking(move || {
                let tables = EngineTables::connect(connect)?;
                match wanted {
                    Some(n) => tables.with_shards(n),
                    None => Ok(tables),
                }
            })
            .await
            .map_err(EngineError::other)??;
            Some(Arc::new(match fence {
                Some(f) => tables.fenced(f),
                None => tables,
            }))
        }
    };
    let budget = spec.meta_blocks_under.unwrap_or(DEFAULT_BUDGET);
    let shared = tables.clone().map(|t| Shared {
        shards: t.shards(),
        refs: Arc::new(TableRefs(t.clone())),
        blocks: Arc::new(TableBlocks::new(t, budget)),
    });
    let backend: Box<dyn MetaBackend> = match (tables, objects) {
        (None, None) => Box::new(db),
        (None, Some(o)) => Box::new(ObjectManifests::new(db, o)),
        (Some(t), None) => Box::new(t),
        (Some(t), Some(o)) => Box::new(ObjectManifests::new(t, o)),
    };
    Ok((backend, shared))
}
