//! Content addresses: the blake3 hash of a block, and the version id of a manifest; the scope
//! of a namespace's references to blocks.

pub mod subtree;

use std::fmt;

/// The blake3 hash of one block's bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

impl BlockHash {
    pub fn of(data: &[u8]) -> Self {
        BlockHash(*blake3::hash(data).as_bytes())
    }

    /// From bytes that came over the wire or out of a database; `None` unless exactly 32 bytes.
    pub fn from_slice(b: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(b).ok().map(BlockHash)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn hex(&self) -> String {
        to_hex(&self.0)
    }

    /// From the 64 hex digits [`BlockHash::hex`] writes (an object's name, say).
    pub fn from_hex(s: &str) -> Option<Self> {
        blake3::Hash::from_hex(s)
            .ok()
            .map(|h| BlockHash(*h.as_bytes()))
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({})", &self.hex()[..16])
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex()[..16])
    }
}

/// A version of an entry: the blake3 hash of its encoded manifest.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Version(pub [u8; 32]);

impl Version {
    pub fn from_slice(b: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(b).ok().map(Version)
    }

    pub fn hex(&self) -> String {
        to_hex(&self.0)
    }

    pub fn from_hex(s: &str) -> Option<Self> {
        blake3::Hash::from_hex(s)
            .ok()
            .map(|h| Version(*h.as_bytes()))
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Version({})", &self.hex()[..16])
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

/// Whose references to blocks a reference is: a namespace, by a name of fixed width (the store
/// keys its references `scope hash`, and an upload ticket carries the scope it uploads for).
/// Derived, not looked up, so a ticket names a namespace without the store keeping a table.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope(pub [u8; 32]);

impl Scope {
    /// The scope of namespace `ns`.
    pub fn of_namespace(ns: &str) -> Self {
        Self::of_bytes(ns.as_bytes())
    }

    /// The scope of the namespace named by `ns` as stored.
    pub fn of_bytes(ns: &[u8]) -> Self {
        let mut h =
            blake3::Hasher::new_derive_key("ktfs 2026-12 namespace scope of block references");
        h.update(ns);
        Scope(*h.finalize().as_bytes())
    }

    pub fn from_slice(b: &[u8]) -> Option<Self> {
        <[u8; 32]>::try_from(b).ok().map(Scope)
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scope({})", &to_hex(&self.0)[..16])
    }
}

fn to_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}
