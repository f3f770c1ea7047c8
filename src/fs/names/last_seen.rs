//! What a mount with stale reads last saw of the namespace, kept past whatever makes its
//! caches forget it: a change the watch tells of (another node created a directory beside
//! the one a pod reads, and the namespace's root listing went), a lease begun anew, the
//! caches' bound. While no store server answers, such a mount answers from here ("as it last
//! saw it", doc/SEMANTICS.md): without it, one change anywhere above a file the node had read
//! whole made the file unreachable the moment the kernel looked its path up again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::bound::{bound, MAX_ENTRIES, MAX_LISTINGS};
use crate::proto::{ListEntry, ResolveResponse};

/// A directory's listing, as `listings` keeps it.
type Entries = Arc<BTreeMap<String, ListEntry>>;

/// Listings, entries and resolved versions as last taken from a store server, each with when.
#[derive(Default)]
pub(crate) struct LastSeen {
    listings: BTreeMap<String, (Instant, Entries)>,
    own: BTreeMap<String, (Instant, Option<ListEntry>)>,
    resolved: BTreeMap<String, (Instant, Arc<ResolveResponse>)>,
}

impl LastSeen {
    pub(crate) fn listing(&mut self, path: &str, entries: &Entries, now: Instant) {
        self.listings
            .insert(path.to_string(), (now, entries.clone()));
        bound(&mut self.listings, MAX_LISTINGS, |v| v.0);
    }

    pub(crate) fn own(&mut self, path: &str, e: &Option<ListEntry>, now: Instant) {
        self.own.insert(path.to_string(), (now, e.clone()));
        bound(&mut self.own, MAX_ENTRIES, |v| v.0);
    }

    pub(crate) fn resolved(&mut self, path: &str, r: &Arc<ResolveResponse>, now: Instant) {
        self.resolved.insert(path.to_string(), (now, r.clone()));
        bound(&mut self.resolved, MAX_ENTRIES, |v| v.0);
    }

    pub(crate) fn last_listing(&self, path: &str) -> Option<Entries> {
        self.listings.get(path).map(|(_, e)| e.clone())
    }

    pub(crate) fn last_own(&self, path: &str) -> Option<Option<ListEntry>> {
        self.own.get(path).map(|(_, e)| e.clone())
    }

    pub(crate) fn last_resolved(&self, path: &str) -> Option<Arc<ResolveResponse>> {
        self.resolved.get(path).map(|(_, r)| r.clone())
    }
}
