//! `kt server migrate`: a single server's data directory copied into cluster mode's engines
//! (its metadata into etcd, its blocks and manifests into an object store), so that servers
//! started on those serve every key the single server held; and back (`--to`): cluster mode's
//! engines copied into a data directory a single server serves.

use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::blocks::files::BlockFiles;
use crate::blocks::store::{self, StoreBlocks, CF_BLOCKS};
use crate::blocks::{BlockError, Served};
use crate::db::{Db, DbError};
use crate::hash::BlockHash;
use crate::meta;
use crate::meta::backend::{BackendError, MetaBackend, Op, Table};
use crate::meta::engine::{EtcdEngine, MetaEngine, OWNER_KEY};

use super::spec::{open_backend, open_objects, MetaSpec, OpenError, StoreSpec};

/// Writes go to the engine in changes of this many entries (each entry its own change, packed
/// into as few transactions as etcd's limits hold).
const BATCH: usize = 512;

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("{0}")]
    Bad(String),
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error("the data directory's database (is its server still running?): {0}")]
    Db(#[from] DbError),
    #[error(transparent)]
    Blocks(#[from] BlockError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("block {0} of the data directory does not match its hash: not copied")]
    Corrupt(String),
}

/// What a migration copied.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    /// Entries of the metadata's tables (keys, manifests, locations, attributes, inodes).
    pub entries: u64,
    pub blocks: u64,
    pub block_bytes: u64,
}

/// Copies the store in `from` (a stopped single server's data directory) to where `to` says:
/// its metadata must be an etcd and its blocks an object store. Copies every entry and block
/// whole; running it again copies the same bytes again (a version is the hash of its
/// manifest, a block's name its hash), so an interrupted migration is finished by another.
pub async fn migrate(from: &Path, to: &StoreSpec) -> Result<Migrated, MigrateError> {
    if to.meta == MetaSpec::Local || to.blocks.is_none() {
        return Err(MigrateError::Bad(
            "a migration needs both --meta etcd://... and --blocks URL".into(),
        ));
    }
    let db_dir = from.join("meta.rocksdb");
    if !db_dir.is_dir() {
        return Err(MigrateError::Bad(format!(
            "{} holds no store (no meta.rocksdb)",
            from.display()
        )));
    }
    let (db, source) = open_dir(from)?;
    let (target_blocks, target) = open_engines(to, &db).await?;
    tokio::task::spawn_blocking(move || {
        let mut done = Migrated::default();
        // Blocks first: a key copied is then never without its blocks.
        copy_blocks(&source, &target_blocks, &mut done)?;
        copy_tables(&db, target.as_ref(), &mut done)?;
        Ok(done)
    })
    .await
    .map_err(|e| MigrateError::Bad(e.to_string()))?
}

/// Copies the store `from` names (an etcd and an object store, no server writing to them)
/// into the data directory `to`, for a single server started there: the way back from
/// [`migrate`]. Blocks first, each checked against its hash, then every table. A directory
/// that holds a store already gets what it lacks; running it again finishes an interrupted
/// one.
pub async fn migrate_back(from: &StoreSpec, to: &Path) -> Result<Migrated, MigrateError> {
    if from.meta == MetaSpec::Local || from.blocks.is_none() {
        return Err(MigrateError::Bad(
            "a migration back needs both --meta etcd://... and --blocks URL".into(),
        ));
    }
    std::fs::create_dir_all(to).map_err(|source| BlockError::Files {
        dir: to.display().to_string(),
        source,
    })?;
    let (db, target_blocks) = open_dir(to)?;
    let (source_blocks, source) = open_engines(from, &db).await?;
    tokio::task::spawn_blocking(move || {
        let mut done = Migrated::default();
        copy_blocks(&source_blocks, &target_blocks, &mut done)?;
        // Every block durable before a key names it.
        target_blocks.make_durable()?;
        copy_tables(source.as_ref(), &db, &mut done)?;
        Ok(done)
    })
    .await
    .map_err(|e| MigrateError::Bad(e.to_string()))?
}

/// A data directory's database and blocks, as a single server keeps them.
fn open_dir(dir: &Path) -> Result<(Db, StoreBlocks), MigrateError> {
    let mut families = meta::FAMILIES.to_vec();
    families.extend(store::FAMILIES);
    let db = Db::open(&dir.join("meta.rocksdb"), &families, &[CF_BLOCKS])?;
    let files = BlockFiles::open(&dir.join("blocks")).map_err(|source| BlockError::Files {
        dir: dir.join("blocks").display().to_string(),
        source,
    })?;
    Ok((db.clone(), StoreBlocks::new(db, files)))
}

/// The blocks and metadata of cluster mode's engines `spec` names.
async fn open_engines(
    spec: &StoreSpec,
    db: &Db,
) -> Result<(StoreBlocks, Box<dyn MetaBackend>), MigrateError> {
    no_server_on(spec).await?;
    let Some(objects) = open_objects(spec).await? else {
        return Err(MigrateError::Bad("no object store named".into()));
    };
    let mut blocks = StoreBlocks::on_objects(db.clone(), objects.clone());
    // The references travel as a table (below); the copy of the blocks writes none. Small
    // blocks go into the metadata as a server puts them there, and come back from it.
    let (backend, shared) = open_backend(spec, db.clone(), Some(objects), None).await?;
    if let Some(shared) = shared {
        blocks = blocks.with_small_blocks(shared.blocks);
    }
    Ok((blocks, backend))
}

/// A migration copies a store no server writes: one a replica owns (its owner key is held) is
/// refused, either way.
async fn no_server_on(spec: &StoreSpec) -> Result<(), MigrateError> {
    let MetaSpec::Etcd(url) = &spec.meta else {
        return Ok(());
    };
    let engine = EtcdEngine::connect(url).await.map_err(OpenError::from)?;
    let Some(claim) = engine.get(OWNER_KEY).await.map_err(OpenError::from)? else {
        return Ok(());
    };
    let claim = String::from_utf8_lossy(&claim.value);
    Err(MigrateError::Bad(format!(
        "a store server serves {} (its owner is at {}): stop every server of it first",
        url.prefix.trim_end_matches('/'),
        claim.split_whitespace().next().unwrap_or("?")
    )))
}

fn copy_blocks(
    source: &StoreBlocks,
    target: &StoreBlocks,
    done: &mut Migrated,
) -> Result<(), MigrateError> {
    let mut hashes = Vec::new();
    source.for_each_block(|h| hashes.push(h))?;
    for h in hashes {
        let bytes = match source.get(&h)? {
            None => continue,
            Some(Served::Bytes(b)) => b.to_vec(),
            Some(Served::File(f, len)) => {
                let mut buf = vec![0u8; len as usize];
                f.read_exact_at(&mut buf, 0)
                    .map_err(|source| BlockError::Files {
                        dir: format!("the block file of {}", h.hex()),
                        source,
                    })?;
                buf
            }
        };
        if BlockHash::of(&bytes) != h {
            return Err(MigrateError::Corrupt(h.hex()));
        }
        target.put(&h, &bytes)?;
        done.blocks += 1;
        done.block_bytes += bytes.len() as u64;
    }
    Ok(())
}

fn copy_tables(
    source: &dyn MetaBackend,
    target: &dyn MetaBackend,
    done: &mut Migrated,
) -> Result<(), MigrateError> {
    for table in [
        Table::Manifests,
        Table::Inodes,
        Table::Attrs,
        Table::Keys,
        Table::Locations,
        Table::Graveyard,
        Table::BlockRefs,
    ] {
        let mut batch: Vec<Vec<Op>> = Vec::with_capacity(BATCH);
        source.for_each(table, &mut |k, v| {
            batch.push(vec![Op::Put(table, k.to_vec(), v.to_vec())]);
            if batch.len() == BATCH {
                done.entries += batch.len() as u64;
                target.commit(std::mem::take(&mut batch))?;
            }
            Ok(())
        })?;
        done.entries += batch.len() as u64;
        if !batch.is_empty() {
            target.commit(batch)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::refs::COMPLETE;
    use crate::meta::engine::{EngineTables, RocksEngine};

    /// The namespaces' block references travel with the tables, their completion marker
    /// too: a store migrated into etcd keeps them, and its first owner rebuilds none.
    #[test]
    fn a_migration_copies_the_block_references_with_the_tables() {
        let dir = tempfile::tempdir().unwrap();
        let mut families = meta::FAMILIES.to_vec();
        families.extend(store::FAMILIES);
        let source = Db::open(&dir.path().join("source"), &families, &[CF_BLOCKS]).unwrap();
        let refs = [vec![1u8; 64], vec![2u8; 64], COMPLETE.to_vec()];
        for k in &refs {
            source.put(store::CF_BLOCK_REFS, k, &[]).unwrap();
        }
        let engine = dir.path().join("engine");
        let target =
            EngineTables::connect(move || async move { RocksEngine::open(&engine) }).unwrap();
        let mut done = Migrated::default();
        copy_tables(&source, &target, &mut done).unwrap();
        for k in &refs {
            assert!(target.get(Table::BlockRefs, k).unwrap().is_some());
        }
        assert_eq!(done.entries, 3);
    }
}
