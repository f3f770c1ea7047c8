//! Publishing a manifest at a key: one [`Publish`] says everything of it; its inline blocks are
//! stored (or carried in its change), it is checked (its blocks in the store, its origin alive,
//! what is at the key), then planned and queued as one change.

use std::collections::HashSet;

use super::backend::{Op, Table};
use super::commit::Ticket;
use super::error::MetaError;
use super::store::MetaStore;
use super::txn::{Lineage, Loc, Txn};
use crate::blocks::refs::ref_key;
use crate::hash::{BlockHash, Version};
use crate::key::{KeyPath, Namespace};
use crate::manifest::{self, EntryKind, Manifest, ManifestError};
use crate::proto::Locale;

/// One publish of a manifest at a key, whole: what [`MetaStore::publish`] and
/// [`MetaStore::publish_queued`] take, so that a caller reads as one call and another engine
/// (cluster mode) can be handed the same request.
#[derive(Clone, Copy)]
pub struct Publish<'a> {
    pub ns: &'a Namespace,
    pub key: &'a KeyPath,
    pub manifest: &'a Manifest,
    /// The key's current version, where `manifest` was made by patching it: its blocks were
    /// checked when it was published and are not looked up again.
    pub base: Option<&'a Manifest>,
    /// Where the blocks are: in the store, or on the node `origin` (`locale=local`).
    pub locale: Locale,
    pub origin: &'a str,
    /// How long the key lives, in seconds; 0: until it is removed.
    pub ttl_secs: u64,
    /// Whether whatever is at `key` is replaced; without it, only the same version is.
    pub force: bool,
    /// When the writer last changed what it publishes (seconds and nanoseconds since the
    /// epoch): the key's ctime. A mount publishes a file at its close, and a close changes
    /// nothing of it. `None`, or a time past this server's clock: the commit's own time.
    pub changed: Option<(i64, u32)>,
    /// Blocks sent with the publish, checked against their hashes and the lengths the
    /// manifest gives them, not yet stored: the publish stores them, and where the metadata
    /// keeps small blocks (cluster mode) writes them in its own change, so that a small file
    /// is one transaction of etcd rather than two, and a refused publish leaves no block.
    pub inline: &'a [(BlockHash, Vec<u8>)],
}

/// Inline blocks one change carries, at most, and their bytes: a change must fit one etcd
/// transaction (128 writes, 1.5 MiB) with its key's own writes and a reference a block.
const MAX_CARRIED: usize = 16;
const MAX_CARRIED_BYTES: usize = 256 << 10;

impl<'a> Publish<'a> {
    /// `manifest` at `key` with its blocks in the store, for good, replacing nothing; the other
    /// fields are set by name (`Publish { force: true, ..Publish::new(ns, key, m) }`).
    pub fn new(ns: &'a Namespace, key: &'a KeyPath, manifest: &'a Manifest) -> Self {
        Publish {
            ns,
            key,
            manifest,
            base: None,
            locale: Locale::Store,
            origin: "",
            ttl_secs: 0,
            force: false,
            changed: None,
            inline: &[],
        }
    }
}

impl MetaStore {
    /// Every block of `m` is in the store and referenced by `ns`, with the length the manifest
    /// gives it: a manifest that lies about a block's length would show one size in listings
    /// and another in reads. Blocks of `known` (the version of the same key a patch was made
    /// against, checked when it was published) are not looked up again: a one-file edit of a
    /// tree of thousands checks one file's blocks, not a lookup per block of the tree
    /// (measured: more than half the server's time of such a publish).
    /// Blocks of `fresh` (the publish's inline ones, stored or carried by it) are not looked
    /// up either: their hashes and lengths were checked as they came.
    fn check_stored_blocks(
        &self,
        p: &Publish<'_>,
        fresh: &HashSet<BlockHash>,
    ) -> Result<Vec<BlockHash>, MetaError> {
        let (ns, key, m, known) = (p.ns, p.key, p.manifest, p.base);
        let known: std::collections::HashSet<(&[u8], u32)> = known
            .iter()
            .flat_map(|k| &k.entries)
            .flat_map(|e| &e.blocks)
            .map(|b| (b.hash.as_slice(), b.len))
            .collect();
        // Only what the namespace references: another's block, named by its hash alone, is
        // missing here, and its length is never told.
        let scope = self.scope_of(ns);
        let mut missing = 0;
        let mut looked_up = Vec::new();
        for e in &m.entries {
            for (i, b) in e.blocks.iter().enumerate() {
                if known.contains(&(b.hash.as_slice(), b.len)) {
                    continue;
                }
                let hash: BlockHash = manifest::block_hash(b)
                    .ok_or_else(|| ManifestError::BadBlock(e.path.clone()))?;
                looked_up.push(hash);
                if fresh.contains(&hash) {
                    continue;
                }
                match self.blocks.stored_len_for(scope.as_ref(), &hash)? {
                    None => missing += 1,
                    Some(len) if len != b.len => {
                        let file = if e.path.is_empty() {
                            key.to_string()
                        } else {
                            format!("{key}/{}", e.path)
                        };
                        return Err(MetaError::BadRequest(format!(
                            "{file}: block {i} ({}) is {len} bytes in the store, the manifest says {}",
                            hash.hex(),
                            b.len
                        )));
                    }
                    Some(_) => {}
                }
            }
        }
        if missing > 0 {
            return Err(MetaError::MissingBlocks(missing));
        }
        Ok(looked_up)
    }

    /// Publishes `p` and returns once the change is durable.
    pub fn publish(&self, p: Publish<'_>) -> Result<Version, MetaError> {
        let (version, ticket) = self.publish_queued(p)?;
        self.wait(ticket)?;
        Ok(version)
    }

    /// [`MetaStore::publish`] without waiting for the change to be durable: its ticket, for
    /// [`MetaStore::wait`] (a batch of publishes queues each, then waits once).
    pub fn publish_queued(&self, p: Publish<'_>) -> Result<(Version, Ticket), MetaError> {
        let carried = self.store_inline(&p)?;
        self.check_publish(&p)?;
        let Publish {
            ns, key, manifest, ..
        } = p;
        let version = manifest::version_of(manifest);
        let new_is_dir = manifest::is_directory(manifest);
        let mut t = Txn::write(self, ns);
        let path = key.as_str();
        t.read_ahead_for_new(path)?;
        t.check_parent(path)?;
        let loc = t.locate(path)?;
        match &loc {
            // A GPU key and a file never share a name, whatever --force says.
            Loc::Key { record } if record.kind() == EntryKind::Gpu => {
                return Err(MetaError::Exists(format!("{key} (a GPU key)")))
            }
            Loc::Nothing => {}
            Loc::Key { record } if record.version == version.0 => {}
            _ if !p.force => return Err(MetaError::Exists(key.to_string())),
            _ => {}
        }
        if !loc.exists() {
            t.stamp_new_entry(path)?;
        }
        if loc.exists() {
            if new_is_dir {
                // A directory replaces the whole subtree.
                t.remove_path(path, &loc, true)?;
            } else if loc.kind() == Some(EntryKind::Directory) {
                if !t.is_empty_dir(path, &loc)? {
                    return Err(MetaError::IsDir(format!("{key} is a directory")));
                }
                t.remove_path(path, &loc, false)?;
            } else if let Loc::Entry { .. } = loc {
                t.remove_path(path, &loc, false)?;
            }
            // What the path showed of its own goes with what it was.
            t.drop_attrs(path)?;
        }
        // Stamped to the nanosecond, as its directory is (a key's record keeps milliseconds).
        let at = p.changed.filter(|c| *c < t.now()).unwrap_or(t.now());
        t.touch_at(path, false, at)?;
        t.put_key_at(
            path,
            manifest.clone(),
            &Lineage::fresh(p.locale, p.origin, p.ttl_secs, self.now_ms()),
            at,
        )?;
        t.carry(carried);
        Ok((version, t.submit()?))
    }

    /// Stores `p`'s inline blocks, in the namespace's references too, but for those its own
    /// change will carry: returned as the writes of them and of their references.
    fn store_inline(&self, p: &Publish<'_>) -> Result<Vec<Op>, MetaError> {
        let scopes: Vec<_> = self.scope_of(p.ns).into_iter().collect();
        let (mut carried, mut count, mut bytes) = (Vec::new(), 0, 0);
        for (hash, data) in p.inline {
            let carry = count < MAX_CARRIED
                && bytes + data.len() <= MAX_CARRIED_BYTES
                && self.blocks.in_meta(data.len());
            if !carry {
                self.blocks.put_for(&scopes, hash, data)?;
                continue;
            }
            count += 1;
            bytes += data.len();
            self.blocks.touch(hash);
            carried.push(Op::Put(
                Table::Blocks,
                hash.as_bytes().to_vec(),
                data.clone(),
            ));
            for s in &scopes {
                carried.push(Op::Put(Table::BlockRefs, ref_key(s, hash), Vec::new()));
            }
        }
        Ok(carried)
    }

    /// What a publish must pass before it is planned: a valid manifest, a live origin for
    /// `locale=local`, and for `locale=store` its blocks stored (and durable).
    fn check_publish(&self, p: &Publish<'_>) -> Result<(), MetaError> {
        manifest::validate(p.manifest)?;
        if p.locale == Locale::Local && !self.node_alive(p.origin) {
            return Err(MetaError::BadRequest(format!(
                "origin node {:?} is not registered with the store server",
                p.origin
            )));
        }
        // A `locale=local` manifest's blocks are on its origin node, not here: its lengths
        // cannot be checked against anything the store holds, and every reader checks the
        // length of each block it receives instead (`fetch`, the mount's loader).
        if p.locale == Locale::Store {
            let fresh: HashSet<BlockHash> = p.inline.iter().map(|(h, _)| *h).collect();
            let named = self.check_stored_blocks(p, &fresh)?;
            // The key must never outlive its blocks in a crash; a publish whose blocks are
            // all durable already does not wait for another's sync.
            self.blocks.make_durable_for(&named)?;
        }
        Ok(())
    }
}
