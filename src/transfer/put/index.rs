//! The put index: what `kt put` remembers of its last publication of a key, as git's index
//! remembers a work tree. For each file it keeps the identity the file had on disk (size,
//! mtime, ctime, inode, device) beside the manifest it published; a file whose identity is
//! unchanged is not read again, and the next put sends a patch against that version rather
//! than the whole manifest. One file per (server, namespace, key) in the user's cache
//! directory, replaced whole by a rename, so a crash leaves the old index or the new one;
//! an index that does not decode, or names another key, is ignored (the put hashes all).

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prost::Message;

use crate::hash::Version;
use crate::manifest::{BlockRef, EntryKind, Manifest};
use crate::proto::{FileStat, PutIndex};

/// Files whose mtime is this close to the index's writing are hashed again: a write in the
/// same tick of the filesystem's clock leaves size and mtime as they were (git's "racily
/// clean" entries). ctime is compared for equality only: no tool sets it back.
const RACY: Duration = Duration::from_secs(2);

/// Where put indexes live: `KT_INDEX_DIR`, else `$XDG_CACHE_HOME/ktfs/put-index`, else
/// `~/.cache/ktfs/put-index`. `None` where there is no home to keep one in.
pub fn dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("KT_INDEX_DIR") {
        return Some(PathBuf::from(d));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("ktfs").join("put-index"))
}

fn file_of(dir: &Path, server: &str, ns: &str, key: &str) -> PathBuf {
    let id = blake3::hash(format!("{server}\0{ns}\0{key}").as_bytes());
    dir.join(&id.to_hex()[..32])
}

/// The identity of a file on disk, as the index compares it.
pub fn stat_of(path: &str, m: &fs::Metadata) -> FileStat {
    FileStat {
        path: path.to_string(),
        size: m.size(),
        mtime_ns: m.mtime().saturating_mul(1_000_000_000) + m.mtime_nsec(),
        ctime_ns: m.ctime().saturating_mul(1_000_000_000) + m.ctime_nsec(),
        ino: m.ino(),
        dev: m.dev(),
    }
}

/// A loaded index: the version it describes, its manifest, and the blocks of each file whose
/// identity it trusts.
pub struct Index {
    pub version: Version,
    pub manifest: Manifest,
    trusted: HashMap<String, (FileStat, Vec<BlockRef>)>,
}

impl Index {
    /// The index of `key` in `dir`, if one is there and whole.
    pub fn load(dir: &Path, server: &str, ns: &str, key: &str) -> Option<Index> {
        let bytes = fs::read(file_of(dir, server, ns, key)).ok()?;
        let Ok(ix) = PutIndex::decode(&bytes[..]) else {
            tracing::warn!(key, "the put index does not decode; hashing every file");
            return None;
        };
        if ix.server != server || ix.namespace != ns || ix.key != key {
            return None;
        }
        let version = Version::from_slice(&ix.version)?;
        let manifest = ix.manifest?;
        let racy_after = ix.written_ns.saturating_sub(RACY.as_nanos() as i64);
        let mut blocks: HashMap<&str, &Vec<BlockRef>> = manifest
            .entries
            .iter()
            .filter(|e| e.kind() == EntryKind::File)
            .map(|e| (e.path.as_str(), &e.blocks))
            .collect();
        let trusted = ix
            .stats
            .into_iter()
            .filter(|s| s.mtime_ns < racy_after)
            .filter_map(|s| {
                let b = blocks.remove(s.path.as_str())?.clone();
                Some((s.path.clone(), (s, b)))
            })
            .collect();
        Some(Index {
            version,
            manifest,
            trusted,
        })
    }

    /// Records `manifest` (published as `version`) and its files' identities, replacing the
    /// previous index of the key whole.
    pub fn save(
        dir: &Path,
        server: &str,
        ns: &str,
        key: &str,
        version: Version,
        manifest: &Manifest,
        stats: Vec<FileStat>,
    ) -> std::io::Result<()> {
        fs::create_dir_all(dir)?;
        let written_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        let ix = PutIndex {
            server: server.to_string(),
            namespace: ns.to_string(),
            key: key.to_string(),
            version: version.0.to_vec(),
            manifest: Some(manifest.clone()),
            stats,
            written_ns,
        };
        let path = file_of(dir, server, ns, key);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        // Not synced: an index lost or torn in a crash only costs the next put its hashing.
        fs::File::create(&tmp)?.write_all(&ix.encode_to_vec())?;
        fs::rename(&tmp, &path)
    }
}

/// What a scan may know of a file's blocks without reading it: a previous put's index, or the
/// key's published manifest.
pub trait Known: Sync {
    /// The blocks of the file whose identity on disk is `stat` (its `path` is the entry path),
    /// if they are known.
    fn blocks(&self, stat: &FileStat) -> Option<Vec<BlockRef>>;
}

/// Knows nothing: every file is hashed.
pub struct Nothing;

impl Known for Nothing {
    fn blocks(&self, _: &FileStat) -> Option<Vec<BlockRef>> {
        None
    }
}

impl Known for Index {
    fn blocks(&self, stat: &FileStat) -> Option<Vec<BlockRef>> {
        let (was, blocks) = self.trusted.get(&stat.path)?;
        (was == stat).then(|| blocks.clone())
    }
}

/// A manifest the store holds, trusted where a file's size and mtime match its entry: what a
/// put without an index (another machine, a cleared cache) knows of the key, as rsync trusts
/// size and mtime.
pub struct Published(pub Manifest);

impl Known for Published {
    fn blocks(&self, stat: &FileStat) -> Option<Vec<BlockRef>> {
        let i = self
            .0
            .entries
            .binary_search_by(|e| e.path.as_str().cmp(&stat.path))
            .ok()?;
        let e = &self.0.entries[i];
        let mtime_ns = e.mtime_sec.saturating_mul(1_000_000_000) + i64::from(e.mtime_nsec);
        (e.kind() == EntryKind::File && e.size == stat.size && mtime_ns == stat.mtime_ns)
            .then(|| e.blocks.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::FileEntry;

    fn manifest(hash: u8) -> Manifest {
        Manifest {
            block_size: 4,
            entries: vec![FileEntry {
                kind: EntryKind::File as i32,
                size: 1,
                blocks: vec![BlockRef {
                    hash: vec![hash; 32],
                    len: 1,
                }],
                ..Default::default()
            }],
        }
    }

    fn stat(mtime_ns: i64) -> FileStat {
        FileStat {
            size: 1,
            mtime_ns,
            ctime_ns: 5,
            ino: 7,
            dev: 1,
            ..Default::default()
        }
    }

    #[test]
    fn trusts_unchanged_old_files_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let old = 1_000_000_000;
        let m = manifest(1);
        let v = crate::manifest::version_of(&m);
        Index::save(d.path(), "s", "ns", "k", v, &m, vec![stat(old)]).unwrap();
        let ix = Index::load(d.path(), "s", "ns", "k").unwrap();
        assert_eq!(ix.version, v);
        assert_eq!(ix.blocks(&stat(old)), Some(m.entries[0].blocks.clone()));
        assert_eq!(ix.blocks(&stat(old + 1)), None, "another mtime");
        assert_eq!(
            ix.blocks(&FileStat {
                ino: 8,
                ..stat(old)
            }),
            None,
            "another inode"
        );
        // Another key, server or namespace has an index of its own.
        assert!(Index::load(d.path(), "s", "ns", "k2").is_none());
        assert!(Index::load(d.path(), "s2", "ns", "k").is_none());

        // A file changed just before the index was written is not trusted: its mtime may not
        // show a later write in the same tick.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64;
        Index::save(d.path(), "s", "ns", "k", v, &m, vec![stat(now)]).unwrap();
        let ix = Index::load(d.path(), "s", "ns", "k").unwrap();
        assert_eq!(ix.blocks(&stat(now)), None);

        // A torn or foreign file is no index.
        let f = file_of(d.path(), "s", "ns", "k");
        fs::write(&f, b"\xff\xff\xff not an index").unwrap();
        assert!(Index::load(d.path(), "s", "ns", "k").is_none());
    }
}
