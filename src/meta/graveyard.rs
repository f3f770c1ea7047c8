//! Garbage kept for a grace period (`kt server --gc-grace-secs`): a collection pass that finds
//! versions and blocks no live key names buries them rather than deleting them, in records of
//! the metadata stamped with the pass's time (`Table::Graveyard`); a later pass deletes what a
//! record holds once the record is older than the grace and what it holds is dead still, and
//! takes out of younger records whatever lives again (a key names it anew; a publish touched
//! it). So whatever a key named at any moment of the last `grace` is still there: a backup of
//! the metadata (an etcd snapshot) no older than the grace restores to keys whose manifests and
//! blocks exist (doc/cluster.md, "Backup and restore").
//!
//! A record is about 1 MiB at most, inside one etcd request; a pass that buries more writes
//! several under the same stamp.

use std::collections::HashSet;

use super::backend::{Op, Table};
use super::error::MetaError;
use super::store::MetaStore;
use crate::hash::{BlockHash, Version};

/// One buried thing: a version (its manifest and locations) or a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Buried {
    Version(Version),
    Block(BlockHash),
}

/// A kind byte and 32 bytes of hash.
const ENTRY: usize = 33;
/// Entries of one record at most.
const PER_RECORD: usize = 30_000;

fn encode(entries: &[Buried]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY);
    for e in entries {
        let (kind, hash) = match e {
            Buried::Version(v) => (b'v', &v.0),
            Buried::Block(h) => (b'b', &h.0),
        };
        out.push(kind);
        out.extend_from_slice(hash);
    }
    out
}

fn decode(value: &[u8]) -> Result<Vec<Buried>, MetaError> {
    let corrupt = || MetaError::Corrupt("a record of the graveyard".into());
    if !value.len().is_multiple_of(ENTRY) {
        return Err(corrupt());
    }
    value
        .chunks_exact(ENTRY)
        .map(|e| match e[0] {
            b'v' => Version::from_slice(&e[1..]).map(Buried::Version),
            b'b' => BlockHash::from_slice(&e[1..]).map(Buried::Block),
            _ => None,
        })
        .map(|e| e.ok_or_else(corrupt))
        .collect()
}

/// A record's key: its stamp, then its number among the records of that stamp.
fn record_key(stamp_ms: u64, n: u32) -> Vec<u8> {
    let mut k = stamp_ms.to_be_bytes().to_vec();
    k.extend_from_slice(&n.to_be_bytes());
    k
}

fn stamp_of(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.get(..8)?.try_into().ok()?))
}

impl MetaStore {
    /// Buries `dead` (what this pass found dead: named by no live key, touched by no one
    /// lately), takes what lives again out of the records, and answers what was buried at
    /// least `grace_ms` before `now_ms` and is dead still: what the pass deletes now. The
    /// records are written here, each change on its own (nothing of it needs another).
    pub(super) fn settle_graveyard(
        &self,
        dead: &HashSet<Buried>,
        grace_ms: u64,
        now_ms: u64,
    ) -> Result<HashSet<Buried>, MetaError> {
        let mut ops = Vec::new();
        let mut listed = HashSet::new();
        let mut due = HashSet::new();
        let mut corrupt = None;
        let walked = self.backend.for_each(Table::Graveyard, &mut |k, v| {
            // Not a record this build writes: dropped.
            let Some(stamp) = stamp_of(k) else {
                ops.push(Op::Delete(Table::Graveyard, k.to_vec()));
                return Ok(());
            };
            let entries = decode(v).map_err(|e| {
                corrupt = Some(e);
                super::BackendError("a corrupt record of the graveyard".into())
            })?;
            let still: Vec<Buried> = entries
                .iter()
                .filter(|e| dead.contains(e))
                .copied()
                .collect();
            listed.extend(still.iter().copied());
            if stamp.saturating_add(grace_ms) <= now_ms {
                due.extend(still);
                ops.push(Op::Delete(Table::Graveyard, k.to_vec()));
            } else if still.is_empty() {
                ops.push(Op::Delete(Table::Graveyard, k.to_vec()));
            } else if still.len() != entries.len() {
                ops.push(Op::Put(Table::Graveyard, k.to_vec(), encode(&still)));
            }
            Ok(())
        });
        // A corrupt record stops the pass: what it holds is neither deleted nor forgotten.
        if let Some(e) = corrupt {
            return Err(e);
        }
        walked?;
        let new: Vec<Buried> = dead
            .iter()
            .filter(|e| !listed.contains(e))
            .copied()
            .collect();
        for (n, chunk) in new.chunks(PER_RECORD).enumerate() {
            let key = record_key(now_ms, n as u32);
            ops.push(Op::Put(Table::Graveyard, key, encode(chunk)));
        }
        self.backend
            .commit(ops.into_iter().map(|op| vec![op]).collect())?;
        Ok(due)
    }
}
