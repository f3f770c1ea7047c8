//! Garbage collection on the store server: manifests no key names any more, the locations of
//! those versions, blocks no live manifest references and namespaces' references to blocks
//! their live keys no longer name are deleted; so are keys whose TTL has run out and block
//! files a crash left without an index entry.
//!
//! A pass marks without holding up publishes, then sweeps under the metadata write lock. What a
//! publish, rename or upload touched since the start of the previous pass is kept whatever the
//! mark saw (the first pass after a start only starts that record and deletes nothing) (`crate::blocks::touched`): a key moved while the mark ran, a block uploaded for a publish that
//! has not committed yet (it has at least one whole interval), a version published again. A
//! publish after the sweep finds deleted blocks missing and uploads them again. Deleting is
//! idempotent and each step leaves nothing that names what is gone: a block's index entry goes
//! before its file, so a crash between them leaves an orphan file, which the next pass takes.
//!
//! With a grace (`--gc-grace-secs`, at least as long as the metadata's backups are kept), what a
//! pass finds dead is buried first and deleted by the first pass after the grace that finds it
//! dead still (`graveyard`).
//!
//! A version open on a node whose lease holds is live too (nodes say what they have open with
//! every heartbeat), so a file removed while a reader holds it open stays readable to its end.
//! Every block taken is remembered for a while (`collected`), and nodes, told of them with their
//! heartbeats, drop them from their caches.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use prost::Message;

use super::backend::{BackendError, Op, Table};
use super::error::MetaError;
use super::graveyard::Buried;
use super::keys::live;
use super::reads::View;
use super::references::{note_scope, Scopes};
use super::store::MetaStore;
use crate::hash::{BlockHash, Scope, Version};
use crate::manifest::{self, Manifest};
use crate::proto::KeyRecord;

/// What a pass's mark found.
pub(super) struct Marked {
    /// The versions live keys name, and those open on nodes.
    pub live_versions: HashSet<Version>,
    pub live_blocks: HashSet<BlockHash>,
    /// The blocks of dead versions: some were published in place on a node and never
    /// reached the store, which must still tell that node to stop serving them.
    pub dead_blocks: HashSet<BlockHash>,
    pub dead_versions: Vec<Version>,
    /// Blocks the store holds that no live manifest names.
    pub candidates: Vec<BlockHash>,
    pub orphans: Vec<BlockHash>,
    /// References of namespaces to blocks their live keys no longer name.
    pub dead_refs: Vec<(Scope, BlockHash)>,
    /// Keys and inodes whose TTL ran out.
    pub expired: Vec<(Table, Vec<u8>)>,
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    pub expired_keys: usize,
    pub manifests: usize,
    pub blocks: usize,
    pub block_bytes: u64,
    pub orphan_files: usize,
    /// References of namespaces to blocks their live keys no longer name.
    pub references: usize,
}

fn record(v: &[u8]) -> Result<KeyRecord, MetaError> {
    KeyRecord::decode(v).map_err(|e| MetaError::Corrupt(e.to_string()))
}

fn blocks_of(m: &Manifest, into: &mut HashSet<BlockHash>) {
    for e in &m.entries {
        into.extend(e.blocks.iter().filter_map(manifest::block_hash));
    }
}

impl MetaStore {
    pub(super) fn touch_version(&self, v: Version) {
        self.touched.touch(v);
    }

    /// Calls `f` with every entry of `table`. The first error ends the walk and the pass: a
    /// mark that skipped an unreadable record would take its version for garbage.
    fn walk(
        &self,
        table: Table,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<(), MetaError>,
    ) -> Result<(), MetaError> {
        let mut failed = None;
        let walked = self.backend.for_each(table, &mut |k, v| {
            f(k, v).map_err(|e| {
                failed = Some(e);
                BackendError("a collection pass stopped".into())
            })
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(walked?),
        }
    }

    /// The mark of a pass: what live keys name (a hard-linked name names its inode, whose
    /// record holds the version) beside `live_versions`, their blocks, and what else the store
    /// holds.
    pub(super) fn mark(
        &self,
        now: i64,
        mut live_versions: HashSet<Version>,
    ) -> Result<Marked, MetaError> {
        // Where namespaces are told apart, the namespaces that name each live version.
        let separate = self.separate_namespaces.load(Ordering::SeqCst);
        let mut scopes = Scopes::new();
        let mut expired = Vec::new();
        for table in [Table::Keys, Table::Inodes] {
            self.walk(table, |k, v| {
                let r = record(v)?;
                if r.inode != 0 && r.version.is_empty() {
                    return Ok(());
                }
                if !live(&r, now) {
                    expired.push((table, k.to_vec()));
                } else if let Some(v) = Version::from_slice(&r.version) {
                    live_versions.insert(v);
                    if separate {
                        note_scope(&mut scopes, k, v);
                    }
                }
                Ok(())
            })?;
        }
        let mut live_blocks = HashSet::new();
        let mut live_refs: HashSet<(Scope, BlockHash)> = HashSet::new();
        // The blocks of dead versions: some were published in place on a node and never
        // reached the store, which must still tell that node to stop serving them.
        let mut dead_blocks = HashSet::new();
        let mut dead_versions = Vec::new();
        self.walk(Table::Manifests, |k, v| {
            let Some(version) = Version::from_slice(k) else {
                return Ok(());
            };
            let m = Manifest::decode(v).map_err(|e| MetaError::Corrupt(e.to_string()))?;
            if live_versions.contains(&version) {
                blocks_of(&m, &mut live_blocks);
                for scope in scopes.get(&version).into_iter().flatten() {
                    let named = m.entries.iter().flat_map(|e| &e.blocks);
                    live_refs.extend(named.filter_map(manifest::block_hash).map(|h| (*scope, h)));
                }
            } else {
                blocks_of(&m, &mut dead_blocks);
                dead_versions.push(version);
            }
            Ok(())
        })?;
        let mut candidates = Vec::new();
        self.blocks.for_each_block(|h| {
            if !live_blocks.contains(&h) {
                candidates.push(h);
            }
        })?;
        let orphans = self.blocks.orphan_files()?;
        let mut dead_refs = Vec::new();
        if separate {
            self.blocks.for_each_reference(|s, h| {
                if !live_refs.contains(&(s, h)) {
                    dead_refs.push((s, h));
                }
            })?;
        }
        Ok(Marked {
            live_versions,
            live_blocks,
            dead_blocks,
            dead_versions,
            candidates,
            orphans,
            dead_refs,
            expired,
        })
    }

    /// Of what a pass found dead, what it deletes now: all of it; with a grace, what was
    /// buried long enough (and what is dead now is buried).
    pub(super) fn due(
        &self,
        versions: Vec<Version>,
        blocks: Vec<BlockHash>,
        now: i64,
    ) -> Result<(Vec<Version>, Vec<BlockHash>), MetaError> {
        let grace = self.gc_grace_ms();
        if grace == 0 {
            return Ok((versions, blocks));
        }
        let dead = versions
            .into_iter()
            .map(Buried::Version)
            .chain(blocks.into_iter().map(Buried::Block))
            .collect();
        let mut split = (Vec::new(), Vec::new());
        for b in self.settle_graveyard(&dead, grace, now.max(0) as u64)? {
            match b {
                Buried::Version(v) => split.0.push(v),
                Buried::Block(h) => split.1.push(h),
            }
        }
        Ok(split)
    }

    /// One pass of collection.
    pub fn collect_garbage(&self) -> Result<GcReport, MetaError> {
        let versions_recorded = self.touched.rotate();
        let blocks_recorded = self.blocks.rotate_touched();
        let mut report = GcReport::default();
        if !(versions_recorded && blocks_recorded) {
            return Ok(report);
        }
        let now = self.now_ms();
        let Marked {
            mut live_versions,
            mut live_blocks,
            mut dead_blocks,
            dead_versions,
            candidates,
            orphans,
            mut dead_refs,
            expired,
        } = self.mark(now, self.open_versions())?;

        // Sweep, with publishes held off: whatever was touched meanwhile is live after all.
        let _write = self.lock();
        // Changes queued for commit are stored first, so what the sweep reads is all there is.
        self.commits.drain(self.backend.as_ref());
        // Opened meanwhile: its manifest may already be among the dead ones.
        let mut touched: Vec<Version> = self.touched.all();
        touched.extend(self.open_versions());
        for v in touched {
            if let Ok(m) = self.manifest(View::Stored, &v.0) {
                blocks_of(&m, &mut live_blocks);
            }
            live_versions.insert(v);
        }
        let mut ops = Vec::new();
        for (table, k) in expired {
            // Still expired: a publish may have replaced it since.
            if let Some(v) = self.backend.get(table, &k)? {
                if !live(&record(&v)?, now) {
                    ops.push(Op::Delete(table, k));
                    report.expired_keys += 1;
                }
            }
        }
        let dead_now = dead_versions
            .into_iter()
            .filter(|v| !live_versions.contains(v));
        let blocks_now = candidates
            .into_iter()
            .filter(|h| !live_blocks.contains(h) && !self.blocks.was_touched(h));
        let (versions_due, blocks_due) = self.due(dead_now.collect(), blocks_now.collect(), now)?;
        for v in &versions_due {
            ops.push(Op::Delete(Table::Manifests, v.0.to_vec()));
            for (k, _) in self.backend.scan_prefix(Table::Locations, &v.0)? {
                ops.push(Op::Delete(Table::Locations, k));
            }
            report.manifests += 1;
        }
        // Manifests and keys first: a crash after this leaves blocks no one names, which the
        // next pass takes. Each deletion is a change of its own (none needs another), so a
        // pass that takes more than one transaction of etcd holds is written in several.
        let written = self
            .backend
            .commit(ops.into_iter().map(|op| vec![op]).collect());
        self.commits.forget_reads();
        written?;
        for h in blocks_due {
            let bytes = self.blocks.remove(&h)?;
            report.block_bytes += bytes;
            report.blocks += 1;
            dead_blocks.insert(h);
            crate::metrics::GC_BLOCKS.inc();
            crate::metrics::GC_BYTES.add(bytes);
        }
        for h in dead_blocks.into_iter().filter(|h| !live_blocks.contains(h)) {
            self.collected.push(h);
        }
        for h in orphans {
            if !self.blocks.was_touched(&h) && self.blocks.remove_orphan(&h)? {
                report.orphan_files += 1;
            }
        }
        // A reference written or asked about since the previous pass is an upload whose
        // publish may not have committed yet. One of a key renamed while the mark ran may go
        // too: its namespace then uploads the block again before it names it anew, which the
        // store keeps once.
        dead_refs.retain(|(s, h)| !self.blocks.reference_was_touched(s, h));
        self.blocks.remove_references(&dead_refs)?;
        report.references = dead_refs.len();
        Ok(report)
    }
}
