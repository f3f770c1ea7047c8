//! What the collector of a store whose replicas share collection asks of them, and what they
//! answer (`gc_shared` says how a pass goes; `engine::gc_board` carries it on etcd).

use std::time::Duration;

use super::backend::Table;
use super::error::MetaError;
use crate::hash::{BlockHash, Scope, Version};

/// How long a replica holds a touch of what a pass doomed, at most.
pub const HOLD: Duration = Duration::from_secs(60);
/// How long after announcing its doom the collector may still delete.
pub const DELETE_WITHIN: Duration = Duration::from_secs(20);

/// Most entries of each kind a pass dooms, and most bytes of expired keys' names: the doom
/// is one value of etcd's (1.5 MiB at most). What does not fit waits for the next pass.
pub const MOST_DOOMED: usize = 4_000;
const MOST_EXPIRED_BYTES: usize = 256 << 10;

/// What replicas touched: blocks asked about or uploaded, namespaces' references to them,
/// versions published or open on nodes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Touches {
    /// Whether every replica had a record before: false, the pass deletes nothing.
    pub recorded: bool,
    pub blocks: Vec<BlockHash>,
    pub refs: Vec<(Scope, BlockHash)>,
    pub versions: Vec<Version>,
}

impl Touches {
    /// `other`'s touches too.
    pub fn merge(&mut self, other: Touches) {
        self.recorded &= other.recorded;
        self.blocks.extend(other.blocks);
        self.refs.extend(other.refs);
        self.versions.extend(other.versions);
    }
}

/// What a pass is about to delete.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Doomed {
    pub pass: u64,
    pub blocks: Vec<BlockHash>,
    pub refs: Vec<(Scope, BlockHash)>,
    pub versions: Vec<Version>,
    /// Keys and inodes whose TTL ran out, each deleted by its shard's owner.
    pub expired: Vec<(Table, Vec<u8>)>,
}

impl Doomed {
    /// Within [`MOST_DOOMED`] of each kind and [`MOST_EXPIRED_BYTES`] of expired names.
    pub(super) fn bound(&mut self) {
        self.blocks.truncate(MOST_DOOMED);
        self.refs.truncate(MOST_DOOMED);
        self.versions.truncate(MOST_DOOMED);
        let mut bytes = 0;
        let fit = self
            .expired
            .iter()
            .take_while(|(_, k)| {
                bytes += k.len() + 1;
                bytes <= MOST_EXPIRED_BYTES
            })
            .count();
        self.expired.truncate(fit.min(MOST_DOOMED));
    }
}

/// The replicas of the store, as the collector speaks to them.
pub trait Replicas: Send + Sync {
    /// Starts a pass: its number, and what every live replica touched since its last report.
    fn start(&self) -> Result<(u64, Touches), MetaError>;
    /// Tells every live replica what the pass deletes: what any of them spares, or `None`
    /// where one cannot answer for the pass (it did not report its start).
    fn doom(&self, doomed: &Doomed) -> Result<Option<Touches>, MetaError>;
    /// The pass is done; `collected`: the blocks it took, which nodes drop.
    fn done(&self, pass: u64, collected: &[BlockHash]) -> Result<(), MetaError>;
}
