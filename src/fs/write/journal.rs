//! The write-back journal: one small record per queued file (its key, the staged bytes' file,
//! mode, owner, mtime) in the node's RocksDB (column family [`CF_WRITEBACK`], under the
//! mount's tag), removed once a publish took in every change. A small file staged in memory
//! has its bytes journaled beside its record, in the same write.

use serde::{Deserialize, Serialize};

use crate::db::{BatchOp, Db};

/// The node database's column family of write-back records.
pub const CF_WRITEBACK: &str = "writeback";

/// One queued publish as journaled.
#[derive(Serialize, Deserialize)]
pub(crate) struct Record {
    pub(crate) key: String,
    /// The staged bytes: a file name in the staging directory (or, with `inline`, the name
    /// the bytes are journaled under).
    pub(crate) data: String,
    /// The bytes are in the journal (a body in memory), not in a file.
    #[serde(default)]
    pub(crate) inline: bool,
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) mtime_sec: i64,
    pub(crate) mtime_nsec: u32,
    /// Orders records of one key (the later wins at replay).
    pub(crate) seq: u64,
}

/// Where a mount's records are: the node's database and the mount's tag.
pub(crate) struct Journal {
    pub(crate) db: Db,
    /// Key prefix of this mount's records (its namespace and mountpoint, hashed; then NUL).
    pub(crate) tag: Vec<u8>,
}

impl Journal {
    pub(crate) fn key(&self, data: &str) -> Vec<u8> {
        let mut k = self.tag.clone();
        k.extend_from_slice(data.as_bytes());
        k
    }

    /// Refused records sort apart: the tag with 0x01 for its NUL.
    pub(crate) fn failed_key(&self, data: &str) -> Vec<u8> {
        self.key_marked(data, 1)
    }

    /// Journaled bytes sort apart from the records too: the tag with 0x02 for its NUL.
    pub(crate) fn bytes_key(&self, data: &str) -> Vec<u8> {
        self.key_marked(data, 2)
    }

    fn key_marked(&self, data: &str, mark: u8) -> Vec<u8> {
        let mut k = self.key(data);
        if let Some(last) = k.get_mut(self.tag.len() - 1) {
            *last = mark;
        }
        k
    }
}

/// A staged file's record in the journal: the database, its key, and the key of its bytes
/// when they are journaled too.
pub struct Journaled(
    pub(crate) Db,
    pub(crate) Vec<u8>,
    pub(crate) Option<Vec<u8>>,
);

impl Journaled {
    pub(crate) fn remove(self) {
        let mut ops = vec![BatchOp::Delete(CF_WRITEBACK, self.1)];
        ops.extend(self.2.map(|k| BatchOp::Delete(CF_WRITEBACK, k)));
        if let Err(e) = self.0.write(ops) {
            tracing::warn!(error = %e, "could not remove a write-back record");
        }
    }
}
