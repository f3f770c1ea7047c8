//! The engine under the metadata, as cluster mode needs it (doc/cluster.md): one sorted map of
//! byte keys to byte values, each entry stamped with the revision of the transaction that last
//! wrote it, read by key or by pages of a prefix, and changed by transactions that write only
//! if the revisions they compare are still those they read. etcd has exactly this shape
//! (`etcd`); RocksDB gets it from a counter kept beside its data (`rocks`), so that both answer
//! the same compares and the same limits, and a test run on one engine holds on the other.
//!
//! Every engine refuses a transaction over etcd's default limits (128 operations, 1.5 MiB a
//! request): a change that fits RocksDB but not etcd would otherwise be found only in a
//! cluster.

#[cfg(test)]
mod tests;

#[cfg(test)]
pub mod counted;
mod etcd;
mod etcd_url;
mod fence;
mod gc_board;
mod lease;
mod manifests;
mod members;
mod nodes;
mod owned;
mod owner;
mod rocks;
mod seam;
mod shards;
mod tables;

pub use etcd::EtcdEngine;
pub use etcd_url::{BadEtcdUrl, EtcdTls, EtcdUrl};
pub use fence::{Fence, OWNER_KEY};
pub use gc_board::{AnswerNote, BoardReplicas, GcBoard, PassNote, TouchNote, DONE, DOOM, START};
pub use manifests::ObjectManifests;
pub use nodes::EtcdNodes;
pub use owner::{Claim, Elector, Standing, DEFAULT_OWNER_TTL};
pub use rocks::RocksEngine;
pub use seam::*;
pub use shards::{assign, shard_of, ShardElector, ShardView};
pub use tables::{EngineTables, SCHEMA};
