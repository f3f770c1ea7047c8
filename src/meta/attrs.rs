//! Setting the mode, owner and mtime of a path: in a file's manifest entry, or in the path
//! attributes of a directory.

use super::error::MetaError;
use super::store::MetaStore;
use super::txn::{Loc, Txn};
use crate::key::{KeyPath, Namespace};
use crate::manifest::{EntryKind, FileEntry};

impl MetaStore {
    /// Sets the mode, owner and/or mtime of whatever is at `key`, and stamps its ctime. A
    /// file's mode, owner and mtime are in its manifest entry (a metadata-only new version that
    /// shares the blocks); a directory's mtime, and everything of a directory that is only a
    /// parent of keys, are path attributes.
    pub fn set_attr(
        &self,
        ns: &Namespace,
        key: &KeyPath,
        mode: Option<u32>,
        mtime: Option<(i64, u32)>,
        owner: (Option<u32>, Option<u32>),
    ) -> Result<(), MetaError> {
        let mut t = Txn::write(self, ns);
        let path = key.as_str();
        let loc = t.locate(path)?;
        let is_dir = loc.kind() == Some(EntryKind::Directory);
        let entry_mtime = mtime.filter(|_| !is_dir);
        let apply = |e: &mut FileEntry| {
            if let Some(m) = mode {
                e.mode = m & 0o7777;
            }
            if owner.0.is_some() {
                e.uid = owner.0;
            }
            if owner.1.is_some() {
                e.gid = owner.1;
            }
            if let Some((s, n)) = entry_mtime {
                e.mtime_sec = s;
                e.mtime_nsec = n;
            }
        };
        let edits_entry = mode.is_some() || owner != (None, None) || entry_mtime.is_some();
        match &loc {
            Loc::Key { record } if record.kind() == EntryKind::Gpu => {
                return Err(MetaError::BadRequest(format!(
                    "{key} is a GPU key: it has no mode, owner or mtime to set"
                )))
            }
            Loc::Key { record } if edits_entry => t.edit_manifest(path, record, |es| {
                if let Some(root) = es.first_mut() {
                    apply(root);
                }
            })?,
            Loc::Entry {
                key: k,
                record,
                sub,
                ..
            } if edits_entry => t.edit_manifest(k, record, |es| {
                if let Some(e) = es.iter_mut().find(|e| e.path == *sub) {
                    apply(e);
                }
            })?,
            Loc::Implicit => t.update_attrs(path, |a| {
                if let Some(m) = mode {
                    a.mode = Some(m & 0o7777);
                }
                if owner.0.is_some() {
                    a.uid = owner.0;
                }
                if owner.1.is_some() {
                    a.gid = owner.1;
                }
            })?,
            Loc::Nothing => return Err(MetaError::NotFound(key.to_string())),
            _ => {}
        }
        if let (true, Some((s, n))) = (is_dir, mtime) {
            t.update_attrs(path, |a| {
                a.mtime_sec = Some(s);
                a.mtime_nsec = n;
            })?;
        }
        t.touch(path, false)?;
        t.commit()
    }
}
