//! Where a path lies and what it resolves to: a key, or a path inside a published directory
//! (with the part of the directory's manifest below it).

use super::error::MetaError;
use super::store::MetaStore;
use super::txn::{Loc, Txn};
use crate::key::{KeyPath, Namespace};
use crate::manifest::{self, Manifest};
use crate::proto::KeyRecord;

/// What a resolve finds.
pub struct Resolved {
    pub key: String,
    pub record: KeyRecord,
    pub manifest: Manifest,
    pub subpath: String,
}

impl MetaStore {
    /// The highest directory above `key` that is not there now: what publishing `key` would
    /// bring into being (`None`: its directory exists).
    pub fn directory_made_by(
        &self,
        ns: &Namespace,
        key: &KeyPath,
    ) -> Result<Option<String>, MetaError> {
        Txn::new(self, ns).topmost_missing(key.as_str())
    }

    pub fn locate(&self, ns: &Namespace, key: &KeyPath) -> Result<Loc, MetaError> {
        Txn::new(self, ns).locate(key.as_str())
    }

    pub fn resolve(&self, ns: &Namespace, key: &KeyPath) -> Result<Resolved, MetaError> {
        let t = Txn::new(self, ns);
        match t.locate(key.as_str())? {
            Loc::Key { record } => Ok(Resolved {
                key: key.to_string(),
                manifest: t.manifest_of(key.as_str(), &record)?,
                record,
                subpath: String::new(),
            }),
            Loc::Entry {
                key: found,
                record,
                sub,
                ..
            } => {
                let full = t.manifest_of(&found, &record)?;
                let manifest = manifest::subtree(&full, &sub)
                    .ok_or_else(|| MetaError::NotFound(key.to_string()))?;
                Ok(Resolved {
                    key: found,
                    record,
                    manifest,
                    subpath: sub,
                })
            }
            Loc::Implicit | Loc::Nothing => Err(MetaError::NotFound(key.to_string())),
        }
    }
}
