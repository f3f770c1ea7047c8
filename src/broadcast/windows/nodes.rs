//! The nodes a window hears of: those that hold a version already (seeds), live nodes as the
//! server's lease table knows them, and who joins.

use crate::hash::Version;
use crate::proto::Role;
use crate::rpc::STORE;

/// A node that holds a whole version already: the store server (empty `node_id`), the origin of
/// a local publication, or a node that fetched it before.
#[derive(Clone, Debug)]
pub struct Seed {
    pub node_id: String,
    pub data_addr: String,
    pub zone: String,
    /// The store or the origin: asked only when no other holder is as near, to spare it.
    pub origin: bool,
}

impl Seed {
    pub(crate) fn label(&self) -> &str {
        if self.node_id.is_empty() {
            STORE
        } else {
            &self.node_id
        }
    }
}

/// A live node as the server's lease table knows it.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub data_addr: String,
    pub zone: String,
}

/// Who is joining.
#[derive(Clone, Debug, Default)]
pub struct Joiner {
    pub node_id: String,
    pub zone: String,
    pub ip: String,
    pub role: Role,
    pub version: Option<Version>,
    pub serves: bool,
    /// A mount's reader: it fetches what it reads, as it reads it.
    pub reads: bool,
}
