//! Which namespace references which of the store's blocks.
//!
//! A block is stored once, whoever uploaded it, but a namespace may name in a publish only the
//! blocks it references: those it uploaded (or sent inline) itself, and those its live keys
//! name. A hash alone is no read capability: another namespace that guesses or learns one is
//! told the block is missing and must upload it whole, and the store's answer, and the time it
//! takes, is what it would be had no one else stored the block (see
//! [`StoreBlocks::put_for`]). A server without authentication has no tenants and keeps no
//! references: a scope of `None` below means "any stored block".
//!
//! References are written by uploads, before the publish that names them and outside its
//! transaction, and collected with garbage; a store that kept none (made before them, or run
//! without authentication since) has them rebuilt from its live keys when it starts with
//! authentication (`MetaStore::rebuild_references`).

use super::store::StoreBlocks;
use super::BlockError;
use crate::hash::{BlockHash, Scope};

/// A key of the references present once they are complete: written after a
/// rebuild, removed by a start without authentication (whose uploads name no namespace). Not
/// 64 bytes, so never a reference.
pub const COMPLETE: &[u8] = b"complete";
pub(crate) fn ref_key(scope: &Scope, hash: &BlockHash) -> Vec<u8> {
    let mut k = Vec::with_capacity(64);
    k.extend_from_slice(&scope.0);
    k.extend_from_slice(&hash.0);
    k
}

impl StoreBlocks {
    /// Whether `scope` references the block (noted for garbage collection: whoever asks is
    /// about to upload or publish it).
    pub fn refers(&self, scope: &Scope, hash: &BlockHash) -> Result<bool, BlockError> {
        self.touched_refs.touch((*scope, *hash));
        self.refs.holds(&ref_key(scope, hash))
    }

    /// Stores a block uploaded for `scopes` (none: a server without authentication) and
    /// references it in each. A block some scope does not reference yet is written as a new
    /// block is, even where another namespace stored it before: one copy stays on disk, and
    /// neither the answer nor its time (the write, the sync at the publish) says it was here.
    pub fn put_for(
        &self,
        scopes: &[Scope],
        hash: &BlockHash,
        data: &[u8],
    ) -> Result<(), BlockError> {
        if scopes.is_empty() {
            return self.put(hash, data);
        }
        let mut known = true;
        for s in scopes {
            known &= self.refers(s, hash)?;
        }
        if known && self.contains(hash)? {
            return Ok(());
        }
        self.write_new(hash, data)?;
        // After the block: a reference never names a block that is not there.
        self.refs
            .add(scopes.iter().map(|s| ref_key(s, hash)).collect())
    }

    /// The blocks of `hashes` that `scope` may not name: those it does not reference and those
    /// not stored. Whether another namespace holds one is never looked at.
    pub fn missing_for(
        &self,
        scope: Option<&Scope>,
        hashes: &[BlockHash],
    ) -> Result<Vec<BlockHash>, BlockError> {
        let Some(scope) = scope else {
            return self.missing(hashes);
        };
        let mut out = Vec::new();
        for h in hashes {
            if !self.refers(scope, h)? || !self.contains(h)? {
                out.push(*h);
            }
        }
        Ok(out)
    }

    /// [`StoreBlocks::stored_len`] of a block `scope` references; `None` for one it does not.
    pub fn stored_len_for(
        &self,
        scope: Option<&Scope>,
        hash: &BlockHash,
    ) -> Result<Option<u32>, BlockError> {
        match scope {
            Some(s) if !self.refers(s, hash)? => Ok(None),
            _ => self.stored_len(hash),
        }
    }

    /// Whether the references are complete (see [`COMPLETE`]).
    pub fn references_complete(&self) -> Result<bool, BlockError> {
        self.refs.holds(COMPLETE)
    }

    /// Forgets every reference, the marker first: what a rebuild starts from, and what a start
    /// without authentication leaves (its uploads reference nothing).
    pub fn clear_references(&self) -> Result<usize, BlockError> {
        self.refs.change(Vec::new(), vec![COMPLETE.to_vec()])?;
        let mut all = Vec::new();
        self.refs.for_each(&mut |k| all.push(k.to_vec()))?;
        let n = all.len();
        self.refs.change(Vec::new(), all)?;
        Ok(n)
    }

    /// Writes references as the owner; with `complete`, the marker after them.
    pub fn add_references(
        &self,
        refs: impl IntoIterator<Item = (Scope, BlockHash)>,
        complete: bool,
    ) -> Result<(), BlockError> {
        let keys = refs.into_iter().map(|(s, h)| ref_key(&s, &h)).collect();
        self.refs.change(keys, Vec::new())?;
        if complete {
            self.refs.change(vec![COMPLETE.to_vec()], Vec::new())?;
        }
        Ok(())
    }

    /// Calls `f` with every reference.
    pub fn for_each_reference(
        &self,
        mut f: impl FnMut(Scope, BlockHash),
    ) -> Result<(), BlockError> {
        self.refs.for_each(&mut |k| {
            if let (Some(s), Some(h)) = (
                k.get(..32).and_then(Scope::from_slice),
                k.get(32..).and_then(BlockHash::from_slice),
            ) {
                f(s, h);
            }
        })
    }

    /// Whether a reference was written or asked about since the start of the previous pass of
    /// collection.
    pub fn reference_was_touched(&self, scope: &Scope, hash: &BlockHash) -> bool {
        self.touched_refs.contains(&(*scope, *hash))
    }

    pub fn remove_references(&self, refs: &[(Scope, BlockHash)]) -> Result<(), BlockError> {
        let keys = refs.iter().map(|(s, h)| ref_key(s, h)).collect();
        self.refs.change(Vec::new(), keys)
    }

    /// What uploads touched since the previous report, and whether anything was recorded
    /// before (see [`crate::blocks::touched::Touched::rotate_and_report`]): blocks, references.
    pub fn report_touched(&self) -> (bool, Vec<BlockHash>, Vec<(Scope, BlockHash)>) {
        let (_, refs) = self.touched_refs.rotate_and_report();
        let (recorded, blocks) = self.touched.rotate_and_report();
        (recorded, blocks, refs)
    }

    /// Pass `pass` of a collection the replicas share deletes `blocks` and `refs`: those
    /// touched here since the last report are spared (returned); a touch of the others waits
    /// until the pass is done, or `hold`.
    pub fn doom(
        &self,
        pass: u64,
        blocks: &[BlockHash],
        refs: &[(Scope, BlockHash)],
        hold: std::time::Duration,
    ) -> (Vec<BlockHash>, Vec<(Scope, BlockHash)>) {
        (
            self.touched.doom(pass, blocks, hold),
            self.touched_refs.doom(pass, refs, hold),
        )
    }

    /// Pass `pass` is done: what it doomed may be touched again.
    pub fn release(&self, pass: u64) {
        self.touched.release(pass);
        self.touched_refs.release(pass);
    }
}
