//! Reads of the stored state, as a view sees it: what readers see (durable), or that with the
//! changes queued for commit laid over it (what a change being planned checks against). Keys,
//! inodes, manifests and path attributes, decoded; names of hard-linked files read through to
//! their inode's record; expired keys, and GPU keys whose holder is gone, left out.

use std::collections::{BTreeMap, HashMap};

use prost::Message;

use super::backend::{KeyValue, MetaBackend, Step, Table};
use super::error::MetaError;
use super::keys::{self, key_bytes, live};
use super::store::MetaStore;
use crate::key::Namespace;
use crate::manifest::{EntryKind, Manifest};
use crate::proto::{KeyRecord, PathAttrs};

/// A page of a listing: the names after `after` in byte order (a directory's without its
/// trailing '/'), at most `limit` of them and about `max_bytes` of answer.
#[derive(Clone, Copy, Debug)]
pub struct Page<'a> {
    pub after: &'a str,
    pub limit: usize,
    pub max_bytes: usize,
}

impl Page<'_> {
    /// All of it, in one.
    pub const WHOLE: Page<'static> = Page {
        after: "",
        limit: usize::MAX,
        max_bytes: usize::MAX,
    };

    /// What a manifest gives a page: one entry past the limit, so that the page knows more
    /// follow.
    pub(super) fn of_manifest(&self) -> (&str, usize) {
        (self.after, self.limit.saturating_add(1))
    }
}

/// A name directly below a directory: a key with its record, or (`None`) a directory of keys.
pub(crate) type Child = (String, Option<KeyRecord>);

/// Which state a read sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum View {
    /// What is durable: what readers see.
    Stored,
    /// What is durable with every change queued for commit laid over it: what a change being
    /// planned (under the write lock) checks against.
    Planned,
}

impl MetaStore {
    /// One stored value as `view` sees it.
    fn get(&self, view: View, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, MetaError> {
        // The overlay first: a batch leaves it only once stored, so a value is in one or the
        // other (or both) at any moment.
        if view == View::Planned {
            if let Some(v) = self.commits.planned_or_read(table, key) {
                return Ok(v);
            }
            let v = self.backend.get(table, key)?;
            self.commits.remember(table, key, v.clone());
            return Ok(v);
        }
        Ok(self.backend.get(table, key)?)
    }

    /// The values whose key starts with `prefix` as `view` sees them, in key order.
    fn scan(&self, view: View, table: Table, prefix: &[u8]) -> Result<Vec<KeyValue>, MetaError> {
        let planned = match view {
            View::Stored => Vec::new(),
            View::Planned => self.commits.planned_below(table, prefix),
        };
        let rows = self.backend.scan_prefix(table, prefix)?;
        if planned.is_empty() {
            return Ok(rows);
        }
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = rows.into_iter().collect();
        for (k, v) in planned {
            match v {
                Some(v) => merged.insert(k, v),
                None => merged.remove(&k),
            };
        }
        Ok(merged.into_iter().collect())
    }

    /// Calls `f` with the values whose key starts with `prefix` as `view` sees them, in no
    /// particular order, until it returns `true`; says whether it did. `f` is told whether a
    /// value is the stored state's with no queued change writing its key (not a queued
    /// change's, which its batch's failure may undo).
    fn scan_until(
        &self,
        view: View,
        table: Table,
        prefix: &[u8],
        mut f: impl FnMut(&[u8], &[u8], bool) -> Result<bool, MetaError>,
    ) -> Result<bool, MetaError> {
        let planned = match view {
            View::Stored => Vec::new(),
            View::Planned => self.commits.planned_below(table, prefix),
        };
        for (k, v) in &planned {
            if let Some(v) = v {
                if f(k, v, false)? {
                    return Ok(true);
                }
            }
        }
        // After the overlay was read: a batch stored since forgot the prefix's emptiness.
        if view == View::Planned && self.commits.known_empty(table, prefix) {
            return Ok(false);
        }
        let mut found = false;
        self.walk_prefix(table, prefix, |k, v| {
            if planned.iter().any(|(p, _)| p.as_slice() == k) {
                return Ok(Step::Next);
            }
            found = f(k, v, true)?;
            Ok(if found { Step::Stop } else { Step::Next })
        })?;
        Ok(found)
    }

    /// Calls `f` with the stored values whose key starts with `prefix`, in key order, going on
    /// as it says (see [`Step`]); its error stops the walk and is returned.
    fn walk_prefix(
        &self,
        table: Table,
        prefix: &[u8],
        f: impl FnMut(&[u8], &[u8]) -> Result<Step, MetaError>,
    ) -> Result<(), MetaError> {
        self.walk_from(table, prefix, (prefix, None), f)
    }

    /// As [`MetaStore::walk_prefix`] over a span (see [`MetaBackend::walk_from`]).
    fn walk_from(
        &self,
        table: Table,
        prefix: &[u8],
        span: (&[u8], Option<&[u8]>),
        mut f: impl FnMut(&[u8], &[u8]) -> Result<Step, MetaError>,
    ) -> Result<(), MetaError> {
        let mut failed = None;
        self.backend.walk_from(table, prefix, span, &mut |k, v| {
            f(k, v).unwrap_or_else(|e| {
                failed = Some(e);
                Step::Stop
            })
        })?;
        failed.map_or(Ok(()), Err)
    }

    pub(crate) fn path_attrs(
        &self,
        view: View,
        ns: &Namespace,
        path: &str,
    ) -> Result<Option<PathAttrs>, MetaError> {
        let Some(v) = self.get(view, Table::Attrs, &key_bytes(ns, path))? else {
            return Ok(None);
        };
        PathAttrs::decode(v.as_slice())
            .map(Some)
            .map_err(|e| MetaError::Corrupt(e.to_string()))
    }

    /// The stored attributes of the paths strictly below `path`, by their path relative to
    /// it: of every path below, or with `one_level` of the names directly in it alone (without
    /// reading what lies deeper); of those after `page_of.0` and up to `page_of.1` alone where
    /// given (a page of a listing).
    pub(super) fn attrs_below(
        &self,
        ns: &Namespace,
        path: &str,
        one_level: bool,
        page_of: (&str, Option<&str>),
    ) -> Result<HashMap<String, PathAttrs>, MetaError> {
        let prefix = if path.is_empty() {
            key_bytes(ns, "")
        } else {
            key_bytes(ns, &format!("{path}/"))
        };
        let mut out = HashMap::new();
        let corrupt = || MetaError::Corrupt("path attributes".into());
        let from = after(&prefix, page_of.0);
        // The first key after the page's last name; no further.
        let to = page_of.1.map(|last| after(&prefix, last));
        self.walk_from(Table::Attrs, &prefix, (&from, to.as_deref()), |k, v| {
            let rel = k.get(prefix.len()..).ok_or_else(corrupt)?;
            if rel.is_empty() {
                return Ok(Step::Next);
            }
            if let (true, Some(i)) = (one_level, rel.iter().position(|&b| b == b'/')) {
                return Ok(Step::Past(prefix.len() + i + 1));
            }
            let a = PathAttrs::decode(v).map_err(|_| corrupt())?;
            let rel =
                String::from_utf8(rel.to_vec()).map_err(|e| MetaError::Corrupt(e.to_string()))?;
            out.insert(rel, a);
            Ok(Step::Next)
        })?;
        Ok(out)
    }

    /// Paths strictly below `path` (everything for the root) with attributes of their own.
    pub(crate) fn attr_paths_below(
        &self,
        view: View,
        ns: &Namespace,
        path: &str,
    ) -> Result<Vec<String>, MetaError> {
        let prefix = if path.is_empty() {
            key_bytes(ns, "")
        } else {
            key_bytes(ns, &format!("{path}/"))
        };
        let skip = ns.as_str().len() + 1;
        let rows = self.scan(view, Table::Attrs, &prefix)?;
        rows.into_iter()
            .filter(|(k, _)| k.len() > skip)
            .map(|(k, _)| {
                String::from_utf8(k[skip..].to_vec()).map_err(|e| MetaError::Corrupt(e.to_string()))
            })
            .collect()
    }

    pub(crate) fn record(
        &self,
        view: View,
        ns: &Namespace,
        key: &str,
    ) -> Result<Option<KeyRecord>, MetaError> {
        let Some(v) = self.get(view, Table::Keys, &key_bytes(ns, key))? else {
            return Ok(None);
        };
        let r = self.name_record(view, ns, &v)?;
        Ok(self.visible(&r, self.now_ms()).then_some(r))
    }

    /// A stored name's record: its own, or a hard-linked file's inode record.
    fn name_record(
        &self,
        view: View,
        ns: &Namespace,
        bytes: &[u8],
    ) -> Result<KeyRecord, MetaError> {
        let r = KeyRecord::decode(bytes).map_err(|e| MetaError::Corrupt(e.to_string()))?;
        if r.inode == 0 {
            return Ok(r);
        }
        self.inode(view, ns, r.inode)?
            .ok_or_else(|| MetaError::Corrupt(format!("inode {} of a name is missing", r.inode)))
    }

    pub(crate) fn inode(
        &self,
        view: View,
        ns: &Namespace,
        id: u64,
    ) -> Result<Option<KeyRecord>, MetaError> {
        let Some(v) = self.get(view, Table::Inodes, &keys::inode_bytes(ns, id))? else {
            return Ok(None);
        };
        KeyRecord::decode(v.as_slice())
            .map(Some)
            .map_err(|e| MetaError::Corrupt(e.to_string()))
    }

    /// Whether a stored key is there for readers: not expired, and a GPU key only while the
    /// node that holds its buffers is alive.
    fn visible(&self, r: &KeyRecord, now_ms: i64) -> bool {
        live(r, now_ms) && (r.kind() != EntryKind::Gpu || self.node_alive(&r.origin_node))
    }

    pub(crate) fn manifest(&self, view: View, version: &[u8]) -> Result<Manifest, MetaError> {
        let bytes = self
            .get(view, Table::Manifests, version)?
            .ok_or_else(|| MetaError::Corrupt("manifest missing for a live key".into()))?;
        Manifest::decode(bytes.as_slice()).map_err(|e| MetaError::Corrupt(e.to_string()))
    }

    /// The manifest of `version`, or `None` where the store holds no such version.
    pub(crate) fn manifest_if_any(&self, version: &[u8]) -> Result<Option<Manifest>, MetaError> {
        match self.backend.get(Table::Manifests, version)? {
            None => Ok(None),
            Some(bytes) => Manifest::decode(bytes.as_slice())
                .map(Some)
                .map_err(|e| MetaError::Corrupt(e.to_string())),
        }
    }

    /// Live keys strictly below `key` (or all keys of the namespace for `None`).
    pub(crate) fn descendants(
        &self,
        view: View,
        ns: &Namespace,
        key: Option<&str>,
    ) -> Result<Vec<(String, KeyRecord)>, MetaError> {
        let prefix = below(ns, key);
        let skip = ns.as_str().len() + 1;
        let mut out = Vec::new();
        let now = self.now_ms();
        for (k, v) in self.scan(view, Table::Keys, &prefix)? {
            let r = self.name_record(view, ns, &v)?;
            if self.visible(&r, now) {
                let name = String::from_utf8(k[skip..].to_vec())
                    .map_err(|e| MetaError::Corrupt(e.to_string()))?;
                out.push((name, r));
            }
        }
        Ok(out)
    }

    /// The level directly below `key` (the namespace's top for `None`) as a listing of it
    /// shows it, in key order (a directory where its first live key lies): each live key there
    /// with its record, and each name live keys lie below as a directory (`None`), found by
    /// reading keys below it only until one is live: a listing of a namespace's root does not
    /// read every key in the namespace. A page of it: the names after `page.after`, at least
    /// every one up to the greatest returned, and whether the walk stopped before the end (more
    /// may follow).
    pub(crate) fn children_page(
        &self,
        ns: &Namespace,
        key: Option<&str>,
        page: Page<'_>,
    ) -> Result<(Vec<Child>, bool), MetaError> {
        let prefix = below(ns, key);
        let name =
            |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|e| MetaError::Corrupt(e.to_string()));
        let mut out = Vec::new();
        let more = self.walk_page(ns, &prefix, page, |k, r| {
            let rel = k
                .get(prefix.len()..)
                .ok_or_else(|| MetaError::Corrupt("a stored key's name".into()))?;
            Ok(match rel.iter().position(|&b| b == b'/') {
                Some(i) => {
                    let n = name(&rel[..i])?;
                    let took = n.as_str() > page.after;
                    if took {
                        out.push((n, None));
                    }
                    (Step::Past(prefix.len() + i + 1), took)
                }
                None => {
                    out.push((name(rel)?, Some(r)));
                    (Step::Next, true)
                }
            })
        })?;
        if more {
            self.directories_passed_over(ns, key, page.after, &mut out)?;
        }
        Ok((out, more))
    }

    /// Walks the live keys of `prefix` from the page's start, as readers see them, handing
    /// each to `f` (which says where to go and whether it took the key) until the page holds
    /// its limit; says whether it stopped with keys left to read.
    fn walk_page(
        &self,
        ns: &Namespace,
        prefix: &[u8],
        page: Page<'_>,
        mut f: impl FnMut(&[u8], KeyRecord) -> Result<(Step, bool), MetaError>,
    ) -> Result<bool, MetaError> {
        let now = self.now_ms();
        let (mut taken, mut more) = (0usize, false);
        self.walk_from(
            Table::Keys,
            prefix,
            (&after(prefix, page.after), None),
            |k, v| {
                if taken >= page.limit {
                    more = true;
                    return Ok(Step::Stop);
                }
                let r = self.name_record(View::Stored, ns, v)?;
                if !self.visible(&r, now) {
                    return Ok(Step::Next);
                }
                let (step, took) = f(k, r)?;
                taken += usize::from(took);
                Ok(step)
            },
        )?;
        Ok(more)
    }

    /// A directory's keys ("d/x") lie after the names that begin with its name and a byte
    /// below '/' ("d.x", "d-x"), so a walk cut short after such a name may not have reached a
    /// directory that comes before it in name order: each name that could be one is asked for.
    fn directories_passed_over(
        &self,
        ns: &Namespace,
        key: Option<&str>,
        after: &str,
        out: &mut Vec<Child>,
    ) -> Result<(), MetaError> {
        let Some(last) = out.iter().map(|(n, _)| n.clone()).max() else {
            return Ok(());
        };
        // Bytes below '/' are ASCII, so each cut falls between characters.
        for (i, _) in last.bytes().enumerate().filter(|&(i, b)| i > 0 && b < b'/') {
            let s = &last[..i];
            if s <= after || out.iter().any(|(n, _)| n == s) {
                continue;
            }
            let path = key.map_or_else(|| s.to_string(), |k| format!("{k}/{s}"));
            if self.any_descendant(View::Stored, ns, &path, |_| false)? {
                out.push((s.to_string(), None));
            }
        }
        Ok(())
    }

    /// A page of the live keys strictly below `key` (all keys for the root) as readers see
    /// them: those whose name relative to `key` comes after `page.after`, at most
    /// `page.limit`, and whether more may follow.
    pub(crate) fn descendants_page(
        &self,
        ns: &Namespace,
        key: Option<&str>,
        page: Page<'_>,
    ) -> Result<(Vec<(String, KeyRecord)>, bool), MetaError> {
        let skip = ns.as_str().len() + 1;
        let mut out = Vec::new();
        let more = self.walk_page(ns, &below(ns, key), page, |k, r| {
            let name = k
                .get(skip..)
                .and_then(|n| String::from_utf8(n.to_vec()).ok())
                .ok_or_else(|| MetaError::Corrupt("a stored key's name".into()))?;
            out.push((name, r));
            Ok((Step::Next, true))
        })?;
        Ok((out, more))
    }

    /// Whether a live key lies strictly below `key`, leaving out the names `skip` says a
    /// change decides itself. Reads keys only until it finds one: a publish into a directory of
    /// thousands of keys asks this of the directory, once or twice.
    /// Reads, in one request of the backend, what planning a new entry at `key` asks of the
    /// stored state and the queue does not answer: its record, its attributes, and whether any
    /// key lies below it (remembered as the planner's reads, [`Commits::remember`]). On etcd
    /// three round trips become one for each file a mount writes.
    ///
    /// [`Commits::remember`]: super::commit::Commits::remember
    pub(crate) fn read_ahead_for_new(&self, ns: &Namespace, key: &str) -> Result<(), MetaError> {
        let stored = key_bytes(ns, key);
        let gets: Vec<(Table, Vec<u8>)> = [Table::Keys, Table::Attrs]
            .into_iter()
            .filter(|t| self.commits.planned_or_read(*t, &stored).is_none())
            .map(|t| (t, stored.clone()))
            .collect();
        let below = key_bytes(ns, &format!("{key}/"));
        let ask_below = self.commits.quiet_below(Table::Keys, &below)
            && !self.commits.known_empty(Table::Keys, &below);
        if gets.is_empty() && !ask_below {
            return Ok(());
        }
        let (values, any) = self
            .backend
            .read_many(&gets, ask_below.then_some((Table::Keys, below.as_slice())))?;
        for ((t, k), v) in gets.iter().zip(values) {
            self.commits.remember(*t, k, v);
        }
        if ask_below && !any {
            self.commits.remember_empty(Table::Keys, &below);
        }
        Ok(())
    }

    pub(crate) fn any_descendant(
        &self,
        view: View,
        ns: &Namespace,
        key: &str,
        skip: impl Fn(&str) -> bool,
    ) -> Result<bool, MetaError> {
        let prefix = key_bytes(ns, &format!("{key}/"));
        let name_at = ns.as_str().len() + 1;
        let name_of = |k: &[u8]| -> Result<String, MetaError> {
            k.get(name_at..)
                .and_then(|n| std::str::from_utf8(n).ok())
                .map(str::to_string)
                .ok_or_else(|| MetaError::Corrupt("a stored key's name".into()))
        };
        let now = self.now_ms();
        let planned = view == View::Planned;
        if planned {
            if let Some(w) = self.commits.witness(Table::Keys, &prefix, now) {
                if !skip(&name_of(&w)?) {
                    return Ok(true);
                }
            }
        }
        self.scan_until(view, Table::Keys, &prefix, |k, v, stored| {
            if skip(&name_of(k)?) {
                return Ok(false);
            }
            let r = self.name_record(view, ns, v)?;
            let found = self.visible(&r, now);
            // A stored key no queued change writes, whose record alone says it lives (not a
            // name of an inode, not a GPU key, which lives with its node): the next plan below
            // this prefix need not ask again, until a batch writes it or it expires.
            if found
                && planned
                && stored
                && r.inode == 0
                && r.kind() != EntryKind::Gpu
                && !self.commits.queued(Table::Keys, k)
            {
                self.commits
                    .remember_witness(Table::Keys, &prefix, k, r.expires_unix_ms);
            }
            Ok(found)
        })
    }
}

/// Where the keys strictly below `key` (every key of `ns` for none) begin.
fn below(ns: &Namespace, key: Option<&str>) -> Vec<u8> {
    match key {
        Some(k) => key_bytes(ns, &format!("{k}/")),
        None => key_bytes(ns, ""),
    }
}

/// The first key of a page that begins after the name `name` below `prefix` (from the first
/// for none): past `name` itself, not past what lies below it, which sorts after it.
fn after(prefix: &[u8], name: &str) -> Vec<u8> {
    let mut from = prefix.to_vec();
    if !name.is_empty() {
        from.extend_from_slice(name.as_bytes());
        from.push(0);
    }
    from
}
