//! Collection in a store whose replicas share its namespaces (a store in shards,
//! doc/cluster.md "Shards", step 5). One replica collects (the first shard's owner, which
//! holds the graveyard), but every replica takes uploads, publishes, and nodes' heartbeats, and
//! remembers what they touched as a single server does. A pass therefore asks all of them, in
//! three steps the collector announces (`Replicas`, on etcd):
//!
//! 1. *Start*: each live replica rotates its record and reports what was touched since its
//!    previous report, and the versions open on the nodes whose heartbeats it takes. The mark
//!    keeps all of it, as a single server keeps its own record. A replica that has no record
//!    yet (just started) makes the pass delete nothing.
//! 2. *Doom*: what the mark and the graveyard leave to delete goes to every live replica, which
//!    spares what was touched since its report (a single server's look at its record under the
//!    write lock), deletes the keys of its own shards whose TTL ran out (only a shard's owner
//!    writes its rows), and from then on holds any touch of what is doomed (an upload's
//!    question, a publish's check of its blocks, a publish of a doomed version) until the pass
//!    is done: such a caller then finds it gone and writes it again. A replica that did not
//!    report the start (it joined since) makes the pass delete nothing.
//! 3. *Done*: the collector deletes what no replica spared, within [`DELETE_WITHIN`] of the doom
//!    (each replica's hold is longer, [`HOLD`], so a collector that stalled cannot delete
//!    what a released touch then names), and says what it took, which every replica tells the
//!    nodes whose heartbeats it takes.
//!
//! A replica that died between the steps took its record with it; what it was uploading for a
//! publish is asked about again by that publish's check, on the shard's owner, which the doom
//! holds.

use std::collections::HashSet;
use std::time::Instant;

use super::backend::{Op, Table};
use super::error::MetaError;
use super::gc::{GcReport, Marked};
use super::gc_peers::{Doomed, Replicas, Touches, DELETE_WITHIN, HOLD};
use super::keys::live;
use super::reads::View;
use super::store::MetaStore;
use crate::hash::{BlockHash, Scope, Version};
use crate::manifest;
use crate::proto::KeyRecord;

fn record(v: &[u8]) -> Result<KeyRecord, MetaError> {
    use prost::Message;
    KeyRecord::decode(v).map_err(|e| MetaError::Corrupt(e.to_string()))
}

/// The namespace a key or inode row begins with.
fn namespace_of(key: &[u8]) -> &[u8] {
    key.split(|b| *b == 0).next().unwrap_or_default()
}

impl MetaStore {
    /// A replica's answer to a pass's start: what it touched since its last report.
    pub fn gc_report(&self) -> Touches {
        let (versions_recorded, mut versions) = self.touched.rotate_and_report();
        let (blocks_recorded, blocks, refs) = self.blocks.report_touched();
        versions.extend(self.open_versions());
        Touches {
            recorded: versions_recorded && blocks_recorded,
            blocks,
            refs,
            versions,
        }
    }

    /// A replica's answer to a pass's doom: what it spares; the expired keys of the
    /// namespaces `holds` says are this replica's deleted (the number deleted beside).
    pub fn gc_doom(
        &self,
        d: &Doomed,
        holds: &dyn Fn(&[u8]) -> bool,
    ) -> Result<(Touches, usize), MetaError> {
        let _write = self.lock();
        // Changes queued for commit are stored first: what they touched is in the record.
        self.commits.drain(self.backend.as_ref());
        let open = self.open_versions();
        let (mut spared_versions, versions): (Vec<Version>, Vec<Version>) =
            d.versions.iter().partition(|v| open.contains(v));
        spared_versions.extend(self.touched.doom(d.pass, &versions, HOLD));
        // The blocks of versions published or opened lately, whose publish looked up only
        // what its base did not name.
        let mut named = HashSet::new();
        for v in self.touched.all().into_iter().chain(open) {
            if let Ok(m) = self.manifest(View::Stored, &v.0) {
                for e in &m.entries {
                    named.extend(e.blocks.iter().filter_map(manifest::block_hash));
                }
            }
        }
        let (mut spared_blocks, blocks): (Vec<BlockHash>, Vec<BlockHash>) =
            d.blocks.iter().partition(|h| named.contains(h));
        let (more, spared_refs) = self.blocks.doom(d.pass, &blocks, &d.refs, HOLD);
        spared_blocks.extend(more);

        let now = self.now_ms();
        let mut ops = Vec::new();
        for (table, k) in &d.expired {
            if !holds(namespace_of(k)) {
                continue;
            }
            // Still expired: a publish may have replaced it since.
            if let Some(v) = self.backend.get(*table, k)? {
                if !live(&record(&v)?, now) {
                    ops.push(vec![Op::Delete(*table, k.clone())]);
                }
            }
        }
        let expired = ops.len();
        if expired > 0 {
            let written = self.backend.commit(ops);
            self.commits.forget_reads();
            written?;
        }
        let spared = Touches {
            recorded: true,
            blocks: spared_blocks,
            refs: spared_refs,
            versions: spared_versions,
        };
        Ok((spared, expired))
    }

    /// A replica's part of a pass's end: the touches it held go on, and the nodes whose
    /// heartbeats it takes learn what was collected.
    pub fn gc_done(&self, pass: u64, collected: &[BlockHash]) {
        self.touched.release(pass);
        self.blocks.release(pass);
        for h in collected {
            self.collected.push(*h);
        }
    }

    /// One pass of collection shared with `replicas` (this one among them).
    pub fn collect_shared(&self, replicas: &dyn Replicas) -> Result<GcReport, MetaError> {
        let mut report = GcReport::default();
        let (pass, touched) = replicas.start()?;
        if !touched.recorded {
            replicas.done(pass, &[])?;
            return Ok(report);
        }
        let now = self.now_ms();
        let Marked {
            live_blocks,
            dead_blocks,
            dead_versions,
            candidates,
            dead_refs,
            expired,
            ..
        } = self.mark(now, touched.versions.iter().copied().collect())?;
        let touched_blocks: HashSet<BlockHash> = touched.blocks.into_iter().collect();
        let touched_refs: HashSet<(Scope, BlockHash)> = touched.refs.into_iter().collect();
        let blocks_now = candidates
            .into_iter()
            .filter(|h| !touched_blocks.contains(h))
            .collect();
        let (versions, blocks) = self.due(dead_versions, blocks_now, now)?;
        let refs = dead_refs
            .into_iter()
            .filter(|r| !touched_refs.contains(r))
            .collect();
        let mut doomed = Doomed {
            pass,
            blocks,
            refs,
            versions,
            expired,
        };
        doomed.bound();
        let announced = Instant::now();
        let answered = replicas.doom(&doomed).inspect_err(|_| {
            // Whatever the replicas held for the pass goes on now, not at their hold's end.
            let _ = replicas.done(pass, &[]);
        })?;
        let Some(spared) = answered else {
            tracing::info!(pass, "a replica joined during the pass: nothing collected");
            replicas.done(pass, &[])?;
            return Ok(report);
        };
        let deleted = self.delete_doomed(
            doomed,
            spared,
            (live_blocks, dead_blocks),
            announced,
            &mut report,
        );
        // The replicas' holds end now, whatever the deletions met, not at their hold's end.
        let told = replicas.done(pass, deleted.as_deref().unwrap_or_default());
        {
            // What the planner remembered of what went.
            let _write = self.lock();
            self.commits.forget_reads();
        }
        deleted?;
        told?;
        Ok(report)
    }

    /// Deletes what the pass doomed but for what a replica `spared`, while in time: the blocks
    /// whose deletion nodes hear of.
    fn delete_doomed(
        &self,
        mut doomed: Doomed,
        spared: Touches,
        (mut live_blocks, mut dead_blocks): (HashSet<BlockHash>, HashSet<BlockHash>),
        announced: Instant,
        report: &mut GcReport,
    ) -> Result<Vec<BlockHash>, MetaError> {
        let pass = doomed.pass;
        let spared_versions: HashSet<Version> = spared.versions.into_iter().collect();
        // A spared version's blocks are live: nodes must not be told to drop them (one
        // published in place names blocks the store never held, so never doomed).
        for v in &spared_versions {
            if let Ok(m) = self.manifest(View::Stored, &v.0) {
                for e in &m.entries {
                    live_blocks.extend(e.blocks.iter().filter_map(manifest::block_hash));
                }
            }
        }
        let spared_blocks: HashSet<BlockHash> = spared.blocks.into_iter().collect();
        let spared_refs: HashSet<(Scope, BlockHash)> = spared.refs.into_iter().collect();
        doomed.versions.retain(|v| !spared_versions.contains(v));
        doomed.blocks.retain(|h| !spared_blocks.contains(h));
        doomed.refs.retain(|r| !spared_refs.contains(r));

        let mut changes = Vec::new();
        for v in &doomed.versions {
            let mut change = vec![Op::Delete(Table::Manifests, v.0.to_vec())];
            for (k, _) in self.backend.scan_prefix(Table::Locations, &v.0)? {
                change.push(Op::Delete(Table::Locations, k));
            }
            changes.push(change);
        }
        let in_time = || announced.elapsed() < DELETE_WITHIN;
        let mut collected = Vec::new();
        if in_time() {
            self.backend.commit(changes)?;
            report.manifests = doomed.versions.len();
            for h in &doomed.blocks {
                if !in_time() {
                    tracing::warn!(
                        pass,
                        "the pass ran out of time: the rest is left for the next"
                    );
                    break;
                }
                let bytes = self.blocks.remove(h)?;
                report.block_bytes += bytes;
                report.blocks += 1;
                dead_blocks.insert(*h);
                crate::metrics::GC_BLOCKS.inc();
                crate::metrics::GC_BYTES.add(bytes);
            }
            if in_time() {
                self.blocks.remove_references(&doomed.refs)?;
                report.references = doomed.refs.len();
            }
            collected.extend(
                dead_blocks
                    .into_iter()
                    .filter(|h| !live_blocks.contains(h) && !spared_blocks.contains(h)),
            );
        }
        Ok(collected)
    }
}
