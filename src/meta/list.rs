//! Listings: the entries of a directory, merged from published keys, their parents and the
//! insides of published directories, with each path's own attributes laid over them; and the
//! listings a walk of the tree reads next, sent ahead with the first.

use std::collections::BTreeMap;

use prost::Message;

use super::error::MetaError;
use super::keys::{file_entry, key_entry, manifest_listing, overlay};
use super::reads::Page;
use super::store::MetaStore;
use super::txn::{Loc, Txn};
use crate::key::{KeyPath, Namespace};
use crate::manifest::{self, EntryKind};
use crate::proto::{ListEntry, ListResponse, Listing, Locale};

impl MetaStore {
    /// The entries directly below `prefix` (or everything below it when `recursive`), merging
    /// published keys, their parents and the insides of published directories, and the listed
    /// directory's own entry (the namespace's root for no prefix).
    pub fn list(
        &self,
        ns: &Namespace,
        prefix: Option<&KeyPath>,
        recursive: bool,
    ) -> Result<ListResponse, MetaError> {
        self.list_with(ns, prefix, recursive, false, Page::WHOLE)
    }

    /// One page of [`MetaStore::list`]: the entries after `page.after`, within its bounds, and
    /// in `next` where the following page begins (empty after the last).
    pub fn list_page(
        &self,
        ns: &Namespace,
        prefix: Option<&KeyPath>,
        recursive: bool,
        page: Page<'_>,
    ) -> Result<ListResponse, MetaError> {
        self.list_with(ns, prefix, recursive, false, page)
    }

    /// The entry of the directory at `prefix` (the namespace's root for none) alone: its
    /// attributes without the cost of what it holds.
    pub fn list_dir_only(
        &self,
        ns: &Namespace,
        prefix: Option<&KeyPath>,
    ) -> Result<ListResponse, MetaError> {
        self.list_with(ns, prefix, false, true, Page::WHOLE)
    }

    fn list_with(
        &self,
        ns: &Namespace,
        prefix: Option<&KeyPath>,
        recursive: bool,
        dir_only: bool,
        page: Page<'_>,
    ) -> Result<ListResponse, MetaError> {
        let page = Page {
            limit: page.limit.max(1),
            ..page
        };
        let t = Txn::new(self, ns);
        let base = prefix.map_or("", KeyPath::as_str);
        let mut out: BTreeMap<String, ListEntry> = BTreeMap::new();
        let bare_dir = || ListEntry {
            is_directory: true,
            locale: Locale::Store as i32,
            kind: EntryKind::Directory as i32,
            ..Default::default()
        };
        let loc = match prefix {
            Some(p) if !page.after.is_empty() => t.locate_listed(p.as_str())?,
            Some(p) => t.locate(p.as_str())?,
            None => Loc::Implicit,
        };
        if dir_only {
            let mut dir = match &loc {
                Loc::Key { record } => Some(key_entry("", record)),
                Loc::Entry { record, entry, .. } => Some(file_entry(String::new(), entry, record)),
                Loc::Implicit => Some(bare_dir()),
                Loc::Nothing => None,
            };
            if let Some(d) = dir.as_mut() {
                overlay(d, t.attrs(base)?.as_ref());
                d.name.clear();
            }
            return Ok(ListResponse {
                entries: Vec::new(),
                exists: loc.exists(),
                dir,
                ahead: Vec::new(),
                next: String::new(),
            });
        }
        let mut dir = match &loc {
            Loc::Key { record } => {
                let m = t.manifest_of(base, record)?;
                take(
                    &mut out,
                    manifest_listing(&m, record, recursive, page.of_manifest()),
                );
                Some(key_entry("", record))
            }
            Loc::Entry {
                key,
                record,
                sub,
                entry,
            } => {
                let full = t.manifest_of(key, record)?;
                let m = manifest::subtree(&full, sub)
                    .ok_or_else(|| MetaError::NotFound(base.to_string()))?;
                take(
                    &mut out,
                    manifest_listing(&m, record, recursive, page.of_manifest()),
                );
                Some(file_entry(String::new(), entry, record))
            }
            Loc::Implicit => Some(bare_dir()),
            Loc::Nothing => None,
        };
        let more = self.list_keys(ns, prefix, recursive, page, &mut out, bare_dir)?;
        // Each source gave at least every name up to the greatest it gave, so the page's first
        // `limit` names miss none.
        let mut entries = Vec::new();
        let mut bytes = 0;
        let mut cut = false;
        for (name, e) in out {
            if entries.len() >= page.limit || (bytes >= page.max_bytes && !entries.is_empty()) {
                cut = true;
                break;
            }
            bytes += e.encoded_len() + ENTRY_SLACK;
            entries.push((name, e));
        }
        let next = match entries.last() {
            Some((last, _)) if cut || more => last.clone(),
            _ => String::new(),
        };
        // One scan of the attributes of the page's names, as the keys were scanned: no lookup
        // each.
        let upto = (!next.is_empty()).then_some(next.as_str());
        let below = self.attrs_below(ns, base, !recursive, (page.after, upto))?;
        let entries = entries
            .into_iter()
            .map(|(name, mut e)| {
                overlay(&mut e, below.get(name.as_str()));
                e
            })
            .collect();
        if let Some(d) = dir.as_mut() {
            overlay(d, t.attrs(base)?.as_ref());
            d.name.clear();
        }
        Ok(ListResponse {
            entries,
            exists: loc.exists(),
            dir,
            ahead: Vec::new(),
            next,
        })
    }

    /// The listings a walk of the tree in name order (ls -R, find, cp -r) reads after the
    /// one of `prefix` (`first`): each directory below it, depth first, then those after it in
    /// its parent (no higher: a walk of a tree that began there would not go on to its
    /// neighbours, and whoever walks higher asks there); whole listings only, until `budget`
    /// entries or `max_bytes` in all.
    pub fn listings_ahead(
        &self,
        ns: &Namespace,
        prefix: Option<&KeyPath>,
        first: &ListResponse,
        budget: usize,
        max_bytes: usize,
    ) -> Result<Vec<Listing>, MetaError> {
        let at = prefix.map_or("", KeyPath::as_str);
        let mut ahead = Ahead {
            out: Vec::new(),
            room: (budget, max_bytes),
        };
        if !self.walk_ahead(ns, subdirs(at, &first.entries, None), &mut ahead)? || at.is_empty() {
            return Ok(ahead.out);
        }
        let (parent, name) = at.rsplit_once('/').unwrap_or(("", at));
        let parent_key =
            KeyPath::parse_prefix(parent).map_err(|e| MetaError::Corrupt(e.to_string()))?;
        let l = self.list(ns, parent_key.as_ref(), false)?;
        self.walk_ahead(ns, subdirs(parent, &l.entries, Some(name)), &mut ahead)?;
        Ok(ahead.out)
    }

    /// Lists `stack` (popped from the end) and the directories below each, depth first, into
    /// `ahead` while it has room; says whether the walk ended without running out of it.
    fn walk_ahead(
        &self,
        ns: &Namespace,
        mut stack: Vec<String>,
        ahead: &mut Ahead,
    ) -> Result<bool, MetaError> {
        while let Some(path) = stack.pop() {
            let Ok(key) = KeyPath::parse(&path) else {
                continue;
            };
            let l = self.list(ns, Some(&key), false)?;
            if !l.exists {
                continue;
            }
            let listing = Listing {
                path,
                entries: l.entries,
                dir: l.dir,
            };
            let (entries, bytes) = (listing.entries.len(), listing.encoded_len());
            if entries > ahead.room.0 || bytes > ahead.room.1 {
                return Ok(false);
            }
            ahead.room = (ahead.room.0 - entries, ahead.room.1 - bytes);
            stack.extend(subdirs(&listing.path, &listing.entries, None));
            ahead.out.push(listing);
        }
        Ok(true)
    }

    /// The keys of a page of the listing into `out`; says whether more may follow.
    fn list_keys(
        &self,
        ns: &Namespace,
        prefix: Option<&KeyPath>,
        recursive: bool,
        page: Page<'_>,
        out: &mut BTreeMap<String, ListEntry>,
        bare_dir: impl Fn() -> ListEntry,
    ) -> Result<bool, MetaError> {
        if !recursive {
            let (children, more) = self.children_page(ns, prefix.map(KeyPath::as_str), page)?;
            for (name, r) in children {
                match r {
                    Some(r) => {
                        out.insert(name.clone(), key_entry(&name, &r));
                    }
                    None => {
                        out.entry(name.clone()).or_insert_with(|| ListEntry {
                            name: format!("{name}/"),
                            ..bare_dir()
                        });
                    }
                }
            }
            return Ok(more);
        }
        let strip = prefix.map_or(0, |p| p.as_str().len() + 1);
        let (keys, more) = self.descendants_page(ns, prefix.map(KeyPath::as_str), page)?;
        for (name, r) in keys {
            out.insert(name[strip..].to_string(), key_entry(&name[strip..], &r));
        }
        Ok(more)
    }
}

/// What an entry costs an answer beyond its own encoding (its tag and length).
const ENTRY_SLACK: usize = 8;

/// A manifest's entries, by name (a directory's without its '/').
fn take(out: &mut BTreeMap<String, ListEntry>, entries: Vec<ListEntry>) {
    for e in entries {
        out.insert(e.name.trim_end_matches('/').to_string(), e);
    }
}

/// Listings asked for ahead, and the entries and bytes still allowed.
struct Ahead {
    out: Vec<Listing>,
    room: (usize, usize),
}

/// The directories among `entries` (of the directory `at`), after the name `after` if given,
/// as paths in a stack that pops them in name order.
fn subdirs(at: &str, entries: &[ListEntry], after: Option<&str>) -> Vec<String> {
    let mut dirs: Vec<String> = entries
        .iter()
        .filter(|e| e.is_directory)
        .map(|e| e.name.trim_end_matches('/'))
        .filter(|n| after.is_none_or(|a| *n > a))
        .map(|n| match at {
            "" => n.to_string(),
            at => format!("{at}/{n}"),
        })
        .collect();
    dirs.reverse();
    dirs
}
