//! What a new entry asks of the directories above it: that one of them can hold it, and which
//! of them it brings into being. Each ancestor's record is read once, root first, and each
//! ancestor is then located against the deepest key above it: asking `Txn::locate` of every
//! ancestor read every record above it again, so a key of many segments cost time quadratic in
//! its depth (8,000 one-letter segments: 117 s, every other publish of the store waiting
//! behind it). `key::MAX_DEPTH` bounds the depth as well.

use super::error::MetaError;
use super::txn::{parent_of, Loc, Txn};
use crate::manifest::EntryKind;
use crate::proto::KeyRecord;

/// The ancestors of a path, nearest first, each with the deepest live key at or above it.
struct Ancestors<'p> {
    paths: Vec<&'p str>,
    /// For each of `paths`, an index into `keys`.
    covering: Vec<Option<usize>>,
    keys: Vec<(String, KeyRecord)>,
}

impl Txn<'_> {
    fn ancestors<'p>(&self, path: &'p str) -> Result<Ancestors<'p>, MetaError> {
        let mut paths = Vec::new();
        let mut cur = parent_of(path);
        while let Some(p) = cur {
            paths.push(p);
            cur = parent_of(p);
        }
        let mut covering = vec![None; paths.len()];
        let mut keys = Vec::new();
        for (i, p) in paths.iter().enumerate().rev() {
            if let Some(r) = self.record(p)? {
                keys.push((p.to_string(), r));
            }
            covering[i] = keys.len().checked_sub(1);
        }
        Ok(Ancestors {
            paths,
            covering,
            keys,
        })
    }

    /// Where the `i`th ancestor (0: the parent) lies.
    fn locate_ancestor(&self, a: &Ancestors<'_>, i: usize) -> Result<Loc, MetaError> {
        self.locate_under(a.paths[i], a.covering[i].map(|k| &a.keys[k]))
    }

    /// Fails unless `path`'s parent can hold it: the root, or a directory of any sort.
    pub fn check_parent(&self, path: &str) -> Result<(), MetaError> {
        let a = self.ancestors(path)?;
        for i in 0..a.paths.len() {
            match self.locate_ancestor(&a, i)?.kind() {
                Some(EntryKind::Directory) => return Ok(()),
                Some(_) => {
                    let p = a.paths[i];
                    return Err(MetaError::NotDir(format!("{p} is not a directory")));
                }
                // Parents of keys need not exist: they appear as directories once a key is below.
                None => {}
            }
        }
        Ok(())
    }

    /// Stamps what a new entry at `path` changes: its directory, and each parent of keys it
    /// brings into being (made now, as `mkdir -p` would), up to the first that was there.
    pub fn stamp_new_entry(&mut self, path: &str) -> Result<(), MetaError> {
        let a = self.ancestors(path)?;
        let mut top = path;
        for i in 0..a.paths.len() {
            if self.locate_ancestor(&a, i)?.exists() {
                break;
            }
            top = a.paths[i];
        }
        // Stamped after every ancestor was located: a stamp writes attributes, never records.
        let mut cur = path;
        while cur != top {
            let Some(p) = parent_of(cur) else { break };
            self.touch(p, true)?;
            cur = p;
        }
        self.touch_parent(top)
    }

    /// The highest directory above `path` that is not there, which a new entry at `path`
    /// brings into being (`None`: its directory exists).
    pub fn topmost_missing(&self, path: &str) -> Result<Option<String>, MetaError> {
        let a = self.ancestors(path)?;
        let mut top = None;
        for i in 0..a.paths.len() {
            if self.locate_ancestor(&a, i)?.exists() {
                break;
            }
            top = Some(a.paths[i].to_string());
        }
        Ok(top)
    }

    /// Forgets the attributes of the directories above `path` that no longer exist: a parent
    /// of keys goes with its last key, and one made again later starts afresh.
    pub fn prune_vanished(&mut self, path: &str) -> Result<(), MetaError> {
        let a = self.ancestors(path)?;
        let mut gone = Vec::new();
        for i in 0..a.paths.len() {
            if self.locate_ancestor(&a, i)?.exists() {
                break;
            }
            gone.push(a.paths[i]);
        }
        for p in gone {
            self.forget_attrs(p);
        }
        Ok(())
    }
}
