//! Changes of names: removing keys and paths, renaming, exchanging two names, and hard links.
//! Only metadata changes; blocks stay where they are.

use super::error::MetaError;
use super::store::MetaStore;
use super::txn::{moved_entries, Lineage, Loc, Txn};
use crate::key::{KeyPath, Namespace};
use crate::manifest::{EntryKind, Manifest};

impl MetaStore {
    pub fn remove(
        &self,
        ns: &Namespace,
        key: &KeyPath,
        recursive: bool,
        prefix: bool,
    ) -> Result<Vec<String>, MetaError> {
        let mut t = Txn::write(self, ns);
        if prefix {
            let doomed: Vec<String> = t
                .descendants(None)?
                .into_iter()
                .map(|(k, _)| k)
                .filter(|k| k.starts_with(key.as_str()))
                .collect();
            if doomed.is_empty() {
                return Err(MetaError::NotFound(format!("{key}*")));
            }
            for k in &doomed {
                t.delete_key(k)?;
                t.drop_attrs(k)?;
                t.touch_parent(k)?;
            }
            for k in &doomed {
                t.prune_vanished(k)?;
            }
            t.commit()?;
            return Ok(doomed);
        }
        let loc = t.locate(key.as_str())?;
        let mut removed: Vec<String> = t
            .descendants(Some(key.as_str()))?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        removed.insert(0, key.to_string());
        t.remove_path(key.as_str(), &loc, recursive)?;
        t.touch_parent(key.as_str())?;
        t.prune_vanished(key.as_str())?;
        t.commit()?;
        Ok(removed)
    }

    /// Moves `from` to `to`: a key, a directory of keys, or a path inside a published directory.
    /// Only metadata changes; blocks stay where they are.
    pub fn rename(
        &self,
        ns: &Namespace,
        from: &KeyPath,
        to: &KeyPath,
        no_replace: bool,
    ) -> Result<(), MetaError> {
        let (f, d) = (from.as_str(), to.as_str());
        if d.starts_with(f) && d.as_bytes().get(f.len()) == Some(&b'/') {
            return Err(MetaError::BadRequest(format!(
                "cannot move {from} into itself"
            )));
        }
        let mut t = Txn::write(self, ns);
        let src = t.locate(f)?;
        let src_kind = src
            .kind()
            .ok_or_else(|| MetaError::NotFound(from.to_string()))?;
        // Onto itself changes nothing, but only once the name is known to exist.
        if f == d {
            return Ok(());
        }
        t.check_parent(d)?;
        let dst = t.locate(d)?;
        if src_kind == EntryKind::Gpu || dst.kind() == Some(EntryKind::Gpu) {
            return Err(MetaError::BadRequest(
                "a GPU key is neither renamed nor replaced by a rename".into(),
            ));
        }
        if let Some(dk) = dst.kind() {
            if no_replace {
                return Err(MetaError::Exists(to.to_string()));
            }
            let (sd, dd) = (src_kind == EntryKind::Directory, dk == EntryKind::Directory);
            if sd && !dd {
                return Err(MetaError::NotDir(format!("{to} is not a directory")));
            }
            if !sd && dd {
                return Err(MetaError::IsDir(format!("{to} is a directory")));
            }
            t.remove_path(d, &dst, false)?;
        }
        move_path(&mut t, f, d, from)?;
        // As a local filesystem stamps them: the moved entry, and both directories.
        let new_dest = !dst.exists();
        t.touch(d, false)?;
        t.touch_parent(f)?;
        if new_dest {
            t.stamp_new_entry(d)?;
        } else {
            t.touch_parent(d)?;
        }
        t.prune_vanished(f)?;
        t.commit()
    }

    /// Swaps what `a` and `b` name (`renameat2(RENAME_EXCHANGE)`): both must exist, of any
    /// kinds, and neither may lie inside the other. One batch, so another node sees both names
    /// as they were or both swapped. The swap passes through a name no one can see, since the
    /// batch is written whole.
    pub fn exchange(&self, ns: &Namespace, a: &KeyPath, b: &KeyPath) -> Result<(), MetaError> {
        let (f, d) = (a.as_str(), b.as_str());
        let inside =
            |x: &str, y: &str| y.starts_with(x) && y.as_bytes().get(x.len()) == Some(&b'/');
        if inside(f, d) || inside(d, f) {
            return Err(MetaError::BadRequest(format!(
                "cannot exchange {a} and {b}: one holds the other"
            )));
        }
        let mut t = Txn::write(self, ns);
        for (p, key) in [(f, a), (d, b)] {
            match t.locate(p)?.kind() {
                None => return Err(MetaError::NotFound(key.to_string())),
                Some(EntryKind::Gpu) => {
                    return Err(MetaError::BadRequest(
                        "a GPU key is neither renamed nor replaced by a rename".into(),
                    ))
                }
                Some(_) => {}
            }
        }
        if f == d {
            return Ok(());
        }
        // A name beside `a` that no key can have (keys never hold a NUL).
        let hidden = match f.rsplit_once('/') {
            Some((dir, _)) => format!("{dir}/\0exchange"),
            None => "\0exchange".to_string(),
        };
        move_path(&mut t, f, &hidden, a)?;
        move_path(&mut t, d, f, b)?;
        move_path(&mut t, &hidden, d, a)?;
        // As a local filesystem stamps them: both entries, and both directories.
        t.touch(f, false)?;
        t.touch(d, false)?;
        t.touch_parent(f)?;
        t.touch_parent(d)?;
        t.commit()
    }

    /// Gives the file at `from` a second name `to` (a hard link): one inode record that both
    /// names share, so a write, chmod or unlink through either is what the other shows. A file
    /// inside a published directory becomes a key of its own first (a metadata-only move).
    pub fn link(&self, ns: &Namespace, from: &KeyPath, to: &KeyPath) -> Result<(), MetaError> {
        let (f, d) = (from.as_str(), to.as_str());
        let mut t = Txn::write(self, ns);
        let src = t.locate(f)?;
        match src.kind() {
            None => return Err(MetaError::NotFound(from.to_string())),
            Some(EntryKind::Directory) => {
                return Err(MetaError::IsDir(format!(
                    "{from} is a directory: it has one name"
                )))
            }
            Some(EntryKind::Gpu) => {
                return Err(MetaError::BadRequest(format!("{from} is a GPU key")))
            }
            _ => {}
        }
        t.check_parent(d)?;
        if t.locate(d)?.exists() {
            return Err(MetaError::Exists(to.to_string()));
        }
        if let Loc::Entry {
            key, record, sub, ..
        } = &src
        {
            let m = t.manifest_of(key, record)?;
            let extracted = Manifest {
                block_size: m.block_size,
                entries: moved_entries(&m, sub, ""),
            };
            t.edit_manifest(key, record, |es| es.retain(|e| e.path != *sub))?;
            t.put_key(f, extracted, &Lineage::of(record))?;
        }
        t.link(f, d)?;
        t.stamp_new_entry(d)?;
        t.commit()
    }
}

/// Moves what `f` names, with every key below it and their path attributes, to `d`, which the
/// caller has made free. Only metadata changes; blocks stay where they are.
fn move_path(t: &mut Txn, f: &str, d: &str, from: &KeyPath) -> Result<(), MetaError> {
    // Keys below the source move with it.
    let below = t.descendants(Some(f))?;
    match t.locate(f)? {
        Loc::Key { .. } => t.move_key(f, d)?,
        Loc::Entry {
            key, record, sub, ..
        } => {
            let same_dir_key = t
                .covering(d)?
                .is_some_and(|(k, r)| k == key && r.is_directory);
            if same_dir_key {
                let to_sub = d[key.len() + 1..].to_string();
                let m = t.manifest_of(&key, &record)?;
                let moved = moved_entries(&m, &sub, &to_sub);
                let pfx = format!("{sub}/");
                t.edit_manifest(&key, &record, |es| {
                    es.retain(|e| e.path != sub && !e.path.starts_with(&pfx));
                    es.extend(moved);
                })?;
            } else {
                let m = t.manifest_of(&key, &record)?;
                let extracted = Manifest {
                    block_size: m.block_size,
                    entries: moved_entries(&m, &sub, ""),
                };
                let pfx = format!("{sub}/");
                t.edit_manifest(&key, &record, |es| {
                    es.retain(|e| e.path != sub && !e.path.starts_with(&pfx))
                })?;
                t.put_key(d, extracted, &Lineage::of(&record))?;
            }
        }
        Loc::Implicit => {}
        Loc::Nothing => return Err(MetaError::NotFound(from.to_string())),
    }
    for (k, _) in below {
        t.move_key(&k, &format!("{d}{}", &k[f.len()..]))?;
    }
    t.move_attrs(f, d)?;
    Ok(())
}
