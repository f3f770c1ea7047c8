//! Which namespaces reference which blocks (`crate::blocks::refs`), seen from the metadata: the
//! scope a namespace's publishes are checked in, and the references rebuilt from the live keys
//! of a store that kept none.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;

use super::backend::{BackendError, MetaBackend, Op, Table};
use super::commit::{refusal, Refusal};
use super::error::MetaError;
use super::store::MetaStore;
use crate::blocks::ref_table::RefTable;
use crate::blocks::BlockError;
use crate::hash::{BlockHash, Scope, Version};
use crate::key::Namespace;
use crate::manifest::{self, Manifest};
use crate::proto::KeyRecord;

/// The references in the metadata's own table ([`Table::BlockRefs`]): on an engine every
/// replica shares, so that an upload any replica took counts at the owner's publish, and a
/// new owner finds them as the last one left them (no rebuild from every key at a takeover).
pub struct TableRefs(pub Arc<dyn MetaBackend>);

fn refs_error(e: BackendError) -> BlockError {
    BlockError::References {
        no_space: refusal(&e) == Some(Refusal::NoSpace),
        source: Box::new(e),
    }
}

impl RefTable for TableRefs {
    fn holds(&self, key: &[u8]) -> Result<bool, BlockError> {
        let got = self.0.get(Table::BlockRefs, key).map_err(refs_error)?;
        Ok(got.is_some())
    }

    fn add(&self, keys: Vec<Vec<u8>>) -> Result<(), BlockError> {
        let ops = keys
            .into_iter()
            .map(|k| Op::Put(Table::BlockRefs, k, Vec::new()))
            .collect();
        self.0.write_shared(ops).map_err(refs_error)
    }

    fn change(&self, puts: Vec<Vec<u8>>, deletes: Vec<Vec<u8>>) -> Result<(), BlockError> {
        let changes = puts
            .into_iter()
            .map(|k| Op::Put(Table::BlockRefs, k, Vec::new()))
            .chain(deletes.into_iter().map(|k| Op::Delete(Table::BlockRefs, k)))
            .map(|op| vec![op])
            .collect::<Vec<_>>();
        match changes.is_empty() {
            true => Ok(()),
            false => self.0.commit(changes).map_err(refs_error),
        }
    }

    fn for_each(&self, f: &mut dyn FnMut(&[u8])) -> Result<(), BlockError> {
        self.0
            .for_each(Table::BlockRefs, &mut |k, _| {
                f(k);
                Ok(())
            })
            .map_err(refs_error)
    }
}

/// What a rebuild did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Rebuilt {
    pub keys: usize,
    pub references: usize,
    pub took: Duration,
}

/// The namespace a stored `namespace NUL ...` key belongs to.
fn scope_of_stored_key(k: &[u8]) -> Option<Scope> {
    let end = k.iter().position(|&b| b == 0)?;
    Some(Scope::of_bytes(&k[..end]))
}

/// The namespaces that name each version, from the stored keys that name them.
pub(super) type Scopes = HashMap<Version, Vec<Scope>>;

/// Notes that the stored key `k` (of the keys or inodes) names `version`.
pub(super) fn note_scope(scopes: &mut Scopes, k: &[u8], version: Version) {
    if let Some(scope) = scope_of_stored_key(k) {
        let of = scopes.entry(version).or_default();
        if !of.contains(&scope) {
            of.push(scope);
        }
    }
}

impl MetaStore {
    /// The scope `ns`'s publishes name blocks in; `None` where namespaces are not told apart
    /// (a server without authentication: every stored block).
    pub fn scope_of(&self, ns: &Namespace) -> Option<Scope> {
        self.separate_namespaces
            .load(Ordering::SeqCst)
            .then(|| Scope::of_namespace(ns.as_str()))
    }

    /// Turns references per namespace on (a server with authentication) or off. Turned on for a
    /// store whose references are not complete, they are rebuilt from its keys first; turned
    /// off, they are forgotten, since uploads then name no namespace.
    pub fn separate_namespaces(&self, on: bool) -> Result<Option<Rebuilt>, MetaError> {
        let rebuilt = match (on, self.blocks.references_complete()?) {
            (true, true) => None,
            (true, false) => Some(self.rebuild_references()?),
            (false, _) => {
                self.blocks.clear_references()?;
                None
            }
        };
        self.separate_namespaces.store(on, Ordering::SeqCst);
        Ok(rebuilt)
    }

    /// Writes a reference for every block of every version a key of a namespace names, after
    /// forgetting whatever references there were (a store run without authentication may have
    /// kept some that its collections since made stale).
    fn rebuild_references(&self) -> Result<Rebuilt, MetaError> {
        let started = Instant::now();
        let _write = self.lock();
        self.commits.drain(self.backend.as_ref());
        self.blocks.clear_references()?;
        let mut keys = 0;
        let mut scopes = Scopes::new();
        for table in [Table::Keys, Table::Inodes] {
            self.backend.for_each(table, &mut |k, v| {
                let version = KeyRecord::decode(v)
                    .ok()
                    .and_then(|r| Version::from_slice(&r.version));
                if let Some(version) = version {
                    keys += 1;
                    note_scope(&mut scopes, k, version);
                }
                Ok(())
            })?;
        }
        let mut refs: Vec<(Scope, BlockHash)> = Vec::new();
        let mut references = 0;
        let mut failed = None;
        let walked = self.backend.for_each(Table::Manifests, &mut |k, v| {
            let Some(of) = Version::from_slice(k).and_then(|v| scopes.get(&v)) else {
                return Ok(());
            };
            let Ok(m) = Manifest::decode(v) else {
                return Ok(());
            };
            for hash in m
                .entries
                .iter()
                .flat_map(|e| &e.blocks)
                .filter_map(manifest::block_hash)
            {
                refs.extend(of.iter().map(|s| (*s, hash)));
            }
            if refs.len() >= 1 << 16 {
                references += refs.len();
                if let Err(e) = self.blocks.add_references(refs.drain(..), false) {
                    failed = Some(e);
                    return Err(super::backend::BackendError("rebuild stopped".into()));
                }
            }
            Ok(())
        });
        if let Some(e) = failed {
            return Err(e.into());
        }
        walked?;
        references += refs.len();
        self.blocks.add_references(refs, true)?;
        let rebuilt = Rebuilt {
            keys,
            references,
            took: started.elapsed(),
        };
        tracing::info!(
            keys,
            references,
            ms = rebuilt.took.as_millis() as u64,
            "rebuilt the namespaces' references to blocks"
        );
        Ok(rebuilt)
    }
}
