//! Keys and namespaces.
//!
//! A key is a relative path such as `my-service/models/v1`. It is checked here, once, before
//! anything is sent anywhere: a bad key never reaches the store server, so nothing is ever
//! partially written under it.

use std::fmt;

/// Largest segment, in bytes (the common NAME_MAX).
pub const MAX_SEGMENT: usize = 255;
/// Largest key, in bytes. A key is a file's path from its namespace's root, and the kernel
/// bounds only each path handed to one call (PATH_MAX, 4096), not how deep a file lies: a
/// mount lets a program `cd` into a tree and make a path of PATH_MAX below it. So a key may be
/// longer than PATH_MAX; this bound only keeps what one request carries small.
pub const MAX_KEY: usize = 16 * 1024;
/// Most segments in a key. A publish stamps each directory a new key brings into being, so
/// a key's depth is work under the store's write lock; deeper trees than this are rare (a
/// local filesystem's are bounded by what `openat` reaches, not by a rule) and a `mkdir -p`
/// through a mount past it gets ENAMETOOLONG.
pub const MAX_DEPTH: usize = 256;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("key is empty")]
    Empty,
    #[error("key {0:?} has an empty segment (`//`)")]
    EmptySegment(String),
    #[error("key {0:?} has a `.` or `..` segment")]
    DotSegment(String),
    #[error("key {0:?} contains a NUL byte")]
    Nul(String),
    #[error("key segment {0:?} is longer than {MAX_SEGMENT} bytes")]
    SegmentTooLong(String),
    #[error("key is longer than {MAX_KEY} bytes")]
    TooLong,
    #[error("key has more than {MAX_DEPTH} segments")]
    TooDeep,
    #[error("key {0:?} starts with `{RESERVED}`, the mount's GPU control tree")]
    Reserved(String),
    #[error("namespace {0:?} is not a Kubernetes namespace name (lowercase letters, digits and `-`, at most 63, starting and ending alphanumeric)")]
    BadNamespace(String),
}

/// The first segment no key may have: the mount shows GPU keys below it (`/kt/.gpu/KEY`).
pub const RESERVED: &str = ".gpu";

/// A validated, normalised key: no leading or trailing `/`, segments checked.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyPath(String);

impl KeyPath {
    /// Parses a key given by a user. One leading and one trailing `/` are dropped (so `/a/b/`
    /// and `a/b` name the same key); everything else must already be clean.
    pub fn parse(raw: &str) -> Result<Self, KeyError> {
        let trimmed = raw.strip_prefix('/').unwrap_or(raw);
        let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
        if trimmed.is_empty() {
            return Err(KeyError::Empty);
        }
        if trimmed.len() > MAX_KEY {
            return Err(KeyError::TooLong);
        }
        if trimmed.contains('\0') {
            return Err(KeyError::Nul(raw.to_string()));
        }
        if trimmed.split('/').nth(MAX_DEPTH).is_some() {
            return Err(KeyError::TooDeep);
        }
        if trimmed.split('/').next() == Some(RESERVED) {
            return Err(KeyError::Reserved(raw.to_string()));
        }
        for seg in trimmed.split('/') {
            if seg.is_empty() {
                return Err(KeyError::EmptySegment(raw.to_string()));
            }
            if seg == "." || seg == ".." {
                return Err(KeyError::DotSegment(raw.to_string()));
            }
            if seg.len() > MAX_SEGMENT {
                return Err(KeyError::SegmentTooLong(seg.to_string()));
            }
        }
        Ok(KeyPath(trimmed.to_string()))
    }

    /// Like [`KeyPath::parse`], but an empty string (or `/`) is the namespace's root, for listing.
    pub fn parse_prefix(raw: &str) -> Result<Option<Self>, KeyError> {
        if raw.is_empty() || raw == "/" {
            return Ok(None);
        }
        Self::parse(raw).map(Some)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// The key extended by a relative path (already made of valid segments).
    pub fn join(&self, rel: &str) -> Result<Self, KeyError> {
        if rel.is_empty() {
            return Ok(self.clone());
        }
        Self::parse(&format!("{}/{}", self.0, rel))
    }

    /// The last segment.
    pub fn name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A Kubernetes namespace name (RFC 1123 label). Keys of one namespace are invisible to another.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Namespace(String);

impl Namespace {
    pub const DEFAULT: &'static str = "default";

    pub fn parse(raw: &str) -> Result<Self, KeyError> {
        let ok = !raw.is_empty()
            && raw.len() <= 63
            && raw
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !raw.starts_with('-')
            && !raw.ends_with('-');
        if ok {
            Ok(Namespace(raw.to_string()))
        } else {
            Err(KeyError::BadNamespace(raw.to_string()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Namespace {
    fn default() -> Self {
        Namespace(Self::DEFAULT.to_string())
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a namespace's shard is drawn from: the first bytes of its BLAKE3 hash, which a
/// client of several replicas keeps to find its shard once it learns how many there are.
pub fn namespace_hash(namespace: impl AsRef<[u8]>) -> u64 {
    let h = blake3::hash(namespace.as_ref());
    let mut first = [0u8; 8];
    first.copy_from_slice(&h.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

/// The shard of `namespace` among `count` (a store in shards: doc/cluster.md, "Shards").
pub fn shard_of(namespace: impl AsRef<[u8]>, count: u32) -> u32 {
    shard_of_hash(namespace_hash(namespace), count)
}

/// The shard of a namespace whose [`namespace_hash`] is `hash`, among `count`.
pub fn shard_of_hash(hash: u64, count: u32) -> u32 {
    u32::try_from(hash % u64::from(count.max(1))).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_slashes() {
        assert_eq!(KeyPath::parse("/a/b/").unwrap().as_str(), "a/b");
        assert_eq!(
            KeyPath::parse("my-svc/models/v1").unwrap().as_str(),
            "my-svc/models/v1"
        );
        assert_eq!(KeyPath::parse("ünï/cødé").unwrap().name(), "cødé");
    }

    #[test]
    fn refuses_bad_keys() {
        assert_eq!(KeyPath::parse(""), Err(KeyError::Empty));
        assert_eq!(KeyPath::parse("/"), Err(KeyError::Empty));
        assert!(matches!(
            KeyPath::parse("a//b"),
            Err(KeyError::EmptySegment(_))
        ));
        assert!(matches!(
            KeyPath::parse("a/../b"),
            Err(KeyError::DotSegment(_))
        ));
        assert!(matches!(
            KeyPath::parse("./a"),
            Err(KeyError::DotSegment(_))
        ));
        assert!(matches!(KeyPath::parse("a\0b"), Err(KeyError::Nul(_))));
        assert!(matches!(
            KeyPath::parse(".gpu/model"),
            Err(KeyError::Reserved(_))
        ));
        assert!(KeyPath::parse("model/.gpu").is_ok());
        let long = "x".repeat(256);
        assert!(matches!(
            KeyPath::parse(&long),
            Err(KeyError::SegmentTooLong(_))
        ));
        assert!(KeyPath::parse(&"x".repeat(255)).is_ok());
        let deep = vec!["y".repeat(200); 21].join("/");
        assert!(deep.len() > 4096 && KeyPath::parse(&deep).is_ok());
        let many = vec!["y".repeat(200); 82].join("/");
        assert_eq!(KeyPath::parse(&many), Err(KeyError::TooLong));
    }

    #[test]
    fn namespaces() {
        assert!(Namespace::parse("team-a").is_ok());
        assert!(Namespace::parse("Team").is_err());
        assert!(Namespace::parse("-a").is_err());
        assert!(Namespace::parse("").is_err());
        assert!(Namespace::parse(&"a".repeat(64)).is_err());
    }
}
