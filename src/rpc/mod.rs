//! The control plane as both ends see it: connections to the store server and to this node's
//! agent ([`client`]), the one table of failures across them ([`status`]), and the constants
//! and names both sides must agree on.

pub mod client;
pub mod gpu_window;
pub mod status;

pub use client::{ClientError, Store};
pub use status::{Fault, RemoteError};

use crate::hash::Version;

/// The store server's port, for both planes.
pub const DEFAULT_PORT: u16 = 7447;
/// Largest control-plane message (a manifest of a tree with very many files).
pub const MAX_RPC_MESSAGE: usize = 256 << 20;
/// Most bytes of blocks one publish may carry inline.
pub const MAX_INLINE_BYTES: usize = 1 << 20;
/// Largest file whose blocks travel inside its publish or its resolve: for a small file,
/// asking which blocks are missing and moving them on the data plane costs two more round trips
/// than the bytes themselves.
pub const MAX_INLINE_FILE: u32 = 64 << 10;
/// Hashes asked about in one `MissingBlocks` call.
pub const MISSING_BATCH: usize = 16_384;

/// Children a member of a broadcast window serves when the window does not say.
pub const DEFAULT_FANOUT: u32 = 50;
/// The label of the store server as a source or a parent.
pub const STORE: &str = "store";

/// The group of a window given no explicit id: the same for every participant of one key.
/// The window of a GPU key's participants that name no group: one per key, apart from the
/// key's file window.
pub fn default_gpu_group(namespace: &str, key: &str) -> String {
    let h = blake3::hash(format!("gpu\0{namespace}\0{key}").as_bytes());
    format!("g-{}", &h.to_hex()[..16])
}

pub fn default_group(namespace: &str, key: &str) -> String {
    let h = blake3::hash(format!("{namespace}\0{key}").as_bytes());
    format!("k-{}", &h.to_hex()[..16])
}

/// A window's group as the server keys it: inside its namespace, so that two namespaces that
/// name the same group, or hold the same version, never share a window. A group scoped once
/// stays as it is, so a client may hand back the group a window answered with.
pub fn scope_group(ns: &str, group: &str) -> String {
    match group.strip_prefix(ns).and_then(|g| g.strip_prefix('/')) {
        Some(_) => group.to_string(),
        None => format!("{ns}/{group}"),
    }
}

/// The implicit window of getters that gave no window settings.
pub fn implicit_group(version: &Version) -> String {
    format!("v-{}", &version.hex()[..16])
}

#[cfg(test)]
mod tests {
    use super::scope_group;

    #[test]
    fn groups_are_scoped_once() {
        assert_eq!(scope_group("team-a", "g"), "team-a/g");
        assert_eq!(scope_group("team-a", "team-a/g"), "team-a/g");
        assert_eq!(scope_group("team-a", "team-b/g"), "team-a/team-b/g");
    }
}
