//! The store server's side of data-plane tickets (`crate::auth::ticket`): its signing keys by
//! epoch ([`TicketKeys`]), kept in the data directory so that tickets outlive a restart (or, for
//! the replicas of a store, derived from a secret they share), rotated daily and whenever the
//! shared token changes; the seed the GPU host key is derived from; and
//! the check that a block served under a read ticket is one of that version's.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::auth::ticket::{Grant, TicketKey, TicketVerifier, TicketVerifiers, VersionBlocks};
use crate::hash::{BlockHash, Version};
use crate::locks;
use crate::meta::{MetaError, MetaStore};

/// The seed of the GPU host key (`auth::gpu_secret`); it signed tickets too before epochs.
const KEY_FILE: &str = "ticket.key";
/// The signing keys' epochs.
const EPOCHS_FILE: &str = "ticket.keys";
/// How long an epoch's key signs before the next takes over.
pub const ROTATE_EVERY: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// How long a new epoch's key is announced before it signs: nodes learn it with a heartbeat
/// (every few seconds by default), so by then every node checks what it signs.
pub const ANNOUNCE: std::time::Duration = std::time::Duration::from_secs(10 * 60);
/// Versions whose block sets are kept: the versions being fetched now.
const VERSIONS_KEPT: usize = 256;

pub(super) fn random_seed() -> std::io::Result<[u8; 32]> {
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))?;
    Ok(key)
}

/// Writes `bytes` to `path` whole (a temporary name, synced, renamed over), readable by this
/// user only: a crash leaves the old file or the new one.
pub(super) fn write_secret(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The GPU host key's seed in `data_dir`, made on first use (readable by this user only).
pub fn load_or_create_key(data_dir: &Path) -> std::io::Result<TicketKey> {
    let path = data_dir.join(KEY_FILE);
    match std::fs::read(&path) {
        Ok(b) => TicketKey::from_bytes(&b).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} is not a 32-byte key", path.display()),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = random_seed()?;
            write_secret(&path, &key)?;
            Ok(TicketKey::from_bytes(&key).expect("32 bytes"))
        }
        Err(e) => Err(e),
    }
}

/// One epoch's key: made at `made`, signing from `signs_from` (seconds since the epoch).
#[derive(Clone)]
struct Epoch {
    key: TicketKey,
    made: u64,
    signs_from: u64,
}

/// The keys in force, oldest first: the previous epoch (its tickets still hold), the one that
/// signs, and the next once announced; with the shared token they were made under.
struct Epochs {
    token: [u8; 32],
    keys: Vec<Epoch>,
}

/// The store server's ticket signing keys by epoch, with the verifiers of those in force that
/// its own data plane checks with (and nodes are sent).
pub struct TicketKeys {
    source: Source,
    epochs: Mutex<Epochs>,
    verifiers: TicketVerifiers,
}

/// Where the epochs' keys come from.
enum Source {
    /// Random seeds, kept in a file of the data directory.
    File(std::path::PathBuf),
    /// Derived from a secret every replica of a store shares (cluster mode: a Kubernetes
    /// Secret they all mount) and the epoch's number, which the clock gives: the replicas sign
    /// and check with the same keys, and a new owner honours the tickets the last one gave,
    /// with nothing kept or told between them.
    Shared(SharedSecret),
}

/// A secret the replicas of a store share, as read from its file.
#[derive(Clone)]
pub struct SharedSecret([u8; 32]);

/// The least a shared secret's file holds: 32 bytes, as `openssl rand -hex 32` or 32 random
/// bytes give.
const SHARED_SECRET_MIN: usize = 32;

impl SharedSecret {
    /// The secret in `path` (its bytes, trailing whitespace aside); an error names the file.
    pub fn read(path: &Path) -> std::io::Result<SharedSecret> {
        let bytes = std::fs::read(path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let end = bytes
            .iter()
            .rposition(|b| !b.is_ascii_whitespace())
            .map_or(0, |i| i + 1);
        if end < SHARED_SECRET_MIN {
            return Err(bad(
                path,
                &format!("a secret of {end} bytes; at least {SHARED_SECRET_MIN} are needed"),
            ));
        }
        Ok(SharedSecret(*blake3::hash(&bytes[..end]).as_bytes()))
    }

    fn derive(&self, what: &[u8]) -> [u8; 32] {
        *blake3::Hasher::new_keyed(&self.0)
            .update(what)
            .finalize()
            .as_bytes()
    }

    /// The seed of the GPU host key, the same on every replica.
    pub fn gpu_key(&self) -> TicketKey {
        TicketKey::from_bytes(&self.derive(b"ktfs gpu host key")).expect("32 bytes")
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn from_hex(s: &str) -> Option<[u8; 32]> {
    blake3::Hash::from_hex(s).ok().map(|h| *h.as_bytes())
}

fn bad(path: &Path, why: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("{}: {why}", path.display()),
    )
}

impl Epochs {
    fn parse(path: &Path, text: &str) -> std::io::Result<Epochs> {
        let mut token = None;
        let mut keys = Vec::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["token", hex] => token = from_hex(hex),
                ["key", epoch, made, from, seed] => {
                    let seed = from_hex(seed).ok_or_else(|| bad(path, "a bad seed"))?;
                    let num = |s: &str| s.parse::<u64>().map_err(|_| bad(path, "a bad number"));
                    let epoch = u32::try_from(num(epoch)?).map_err(|_| bad(path, "a bad epoch"))?;
                    keys.push(Epoch {
                        key: TicketKey::of_epoch(&seed, epoch)
                            .ok_or_else(|| bad(path, "a bad seed"))?,
                        made: num(made)?,
                        signs_from: num(from)?,
                    });
                }
                [] => {}
                _ => return Err(bad(path, "a line of neither a token nor a key")),
            }
        }
        let token = token.ok_or_else(|| bad(path, "no token line"))?;
        if keys.is_empty() {
            return Err(bad(path, "no key"));
        }
        keys.sort_by_key(|k| k.key.epoch());
        Ok(Epochs { token, keys })
    }

    fn text(&self) -> String {
        let mut out = format!("token {}\n", BlockHash(self.token).hex());
        for k in &self.keys {
            out += &format!(
                "key {} {} {} {}\n",
                k.key.epoch(),
                k.made,
                k.signs_from,
                BlockHash(*k.key.as_bytes()).hex()
            );
        }
        out
    }

    /// The key that signs at `now`: the newest that signs from then.
    fn signing(&self, now: u64) -> &Epoch {
        self.keys
            .iter()
            .rev()
            .find(|k| k.signs_from <= now)
            .unwrap_or(&self.keys[0])
    }

    fn fresh(token: [u8; 32], epoch: u32, now: u64) -> std::io::Result<Epochs> {
        Ok(Epochs {
            token,
            keys: vec![Epoch {
                key: TicketKey::of_epoch(&random_seed()?, epoch).expect("32 bytes"),
                made: now,
                signs_from: now,
            }],
        })
    }

    /// Brings the epochs to `now`: a key that has signed for [`ROTATE_EVERY`] gets a successor,
    /// announced [`ANNOUNCE`] before it signs; only the epoch before the signing one is kept of
    /// the older ones. Whether anything changed.
    fn rotate(&mut self, now: u64) -> std::io::Result<bool> {
        let mut changed = false;
        let signing = self.signing(now).clone();
        let newest = self.keys.last().map_or(0, |k| k.key.epoch());
        if newest == signing.key.epoch()
            && now >= signing.signs_from + ROTATE_EVERY.as_secs().saturating_sub(ANNOUNCE.as_secs())
        {
            let epoch = newest + 1;
            self.keys.push(Epoch {
                key: TicketKey::of_epoch(&random_seed()?, epoch).expect("32 bytes"),
                made: now,
                signs_from: now.max(signing.signs_from + ROTATE_EVERY.as_secs()),
            });
            changed = true;
        }
        let keep_from = self.signing(now).key.epoch().saturating_sub(1);
        let before = self.keys.len();
        self.keys.retain(|k| k.key.epoch() >= keep_from);
        Ok(changed || self.keys.len() != before)
    }

    fn verifiers(&self) -> Vec<TicketVerifier> {
        self.keys.iter().map(|k| k.key.verifier()).collect()
    }

    /// The epochs in force at `now` from a shared secret: epoch `n` signs from `(n - 1)` days
    /// after 1970, announced [`ANNOUNCE`] before; the one before is kept. Its seed is the
    /// secret's hash of its number and the shared token's mark, so a changed token changes
    /// every key.
    fn derived(secret: &SharedSecret, token: [u8; 32], now: u64) -> Epochs {
        let day = ROTATE_EVERY.as_secs();
        let signing = u32::try_from(now / day + 1).unwrap_or(u32::MAX);
        let next_from = u64::from(signing) * day;
        let last = match now + ANNOUNCE.as_secs() >= next_from {
            true => signing.saturating_add(1),
            false => signing,
        };
        let keys = (signing.saturating_sub(1).max(1)..=last)
            .map(|epoch| {
                let mut what = b"ktfs ticket epoch".to_vec();
                what.extend_from_slice(&token);
                what.extend_from_slice(&epoch.to_le_bytes());
                let from = u64::from(epoch - 1) * day;
                Epoch {
                    key: TicketKey::of_epoch(&secret.derive(&what), epoch).expect("32 bytes"),
                    made: from,
                    signs_from: from,
                }
            })
            .collect();
        Epochs { token, keys }
    }

    fn numbers(&self) -> Vec<u32> {
        self.keys.iter().map(|k| k.key.epoch()).collect()
    }
}

impl TicketKeys {
    /// The epochs kept in `data_dir` (made on first use), brought to now. `token` names the
    /// shared token the server runs with (see [`token_mark`]): where it changed since, every
    /// ticket issued before dies with a new epoch that signs at once.
    pub fn load_or_create(data_dir: &Path, token: [u8; 32]) -> std::io::Result<TicketKeys> {
        Self::load_at(data_dir, token, unix_now())
    }

    fn load_at(data_dir: &Path, token: [u8; 32], now: u64) -> std::io::Result<TicketKeys> {
        let path = data_dir.join(EPOCHS_FILE);
        let mut epochs = match std::fs::read_to_string(&path) {
            Ok(text) => Epochs::parse(&path, &text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Epochs::fresh(token, 1, now)?,
            Err(e) => return Err(e),
        };
        if epochs.token != token {
            let next = epochs.keys.last().map_or(0, |k| k.key.epoch()) + 1;
            tracing::info!(
                epoch = next,
                "the shared token changed: every ticket issued before is retired"
            );
            epochs = Epochs::fresh(token, next, now)?;
        }
        epochs.rotate(now)?;
        write_secret(&path, epochs.text().as_bytes())?;
        Ok(TicketKeys::of(Source::File(path), epochs))
    }

    /// The epochs `secret` gives (a store's replicas share it), under the shared token
    /// `token` names: nothing is kept on disk.
    pub fn shared(secret: SharedSecret, token: [u8; 32]) -> TicketKeys {
        Self::shared_at(secret, token, unix_now())
    }

    fn shared_at(secret: SharedSecret, token: [u8; 32], now: u64) -> TicketKeys {
        let epochs = Epochs::derived(&secret, token, now);
        TicketKeys::of(Source::Shared(secret), epochs)
    }

    fn of(source: Source, epochs: Epochs) -> TicketKeys {
        TicketKeys {
            source,
            verifiers: TicketVerifiers::new(epochs.verifiers()),
            epochs: Mutex::new(epochs),
        }
    }

    /// A ticket for `grant`, valid for `ttl`, signed by the epoch that signs now.
    pub fn issue(&self, grant: &Grant, ttl: std::time::Duration) -> bytes::Bytes {
        let now = unix_now();
        let key = locks::lock(&self.epochs).signing(now).key.clone();
        key.issue_at(grant, now + ttl.as_secs())
    }

    /// What checks tickets: the epochs in force, kept current by [`TicketKeys::rotate`].
    pub fn verifiers(&self) -> TicketVerifiers {
        self.verifiers.clone()
    }

    /// The public key that signs now.
    pub fn signing_public(&self) -> TicketVerifier {
        locks::lock(&self.epochs).signing(unix_now()).key.verifier()
    }

    /// Rotates where due (see [`Epochs::rotate`]), kept on disk before it is used.
    pub fn rotate(&self) -> std::io::Result<bool> {
        self.rotate_at(unix_now())
    }

    fn rotate_at(&self, now: u64) -> std::io::Result<bool> {
        let mut epochs = locks::lock(&self.epochs);
        let next = match &self.source {
            Source::File(path) => {
                let mut next = Epochs {
                    token: epochs.token,
                    keys: epochs.keys.clone(),
                };
                if !next.rotate(now)? {
                    return Ok(false);
                }
                write_secret(path, next.text().as_bytes())?;
                next
            }
            Source::Shared(secret) => {
                let next = Epochs::derived(secret, epochs.token, now);
                if next.numbers() == epochs.numbers() {
                    return Ok(false);
                }
                next
            }
        };
        *epochs = next;
        self.verifiers.set(epochs.verifiers());
        tracing::info!(
            signing = epochs.signing(now).key.epoch(),
            "ticket keys rotated"
        );
        Ok(true)
    }
}

/// What names a shared token among the epochs' records: a hash of it (none: no shared token).
pub fn token_mark(shared_token: Option<&str>) -> [u8; 32] {
    blake3::derive_key(
        "ktfs 2026-12 ticket epochs shared token",
        shared_token.unwrap_or_default().as_bytes(),
    )
}

/// Block sets of versions, from their manifests.
pub struct ManifestBlocks {
    meta: Arc<MetaStore>,
    sets: Mutex<HashMap<Version, Arc<HashSet<BlockHash>>>>,
}

impl ManifestBlocks {
    pub fn new(meta: Arc<MetaStore>) -> Self {
        ManifestBlocks {
            meta,
            sets: Mutex::new(HashMap::new()),
        }
    }

    fn set_of(&self, version: &Version) -> Option<Arc<HashSet<BlockHash>>> {
        if let Some(s) = locks::lock(&self.sets).get(version) {
            return Some(s.clone());
        }
        let set = match blocks_of(&self.meta, version) {
            Ok(Some(s)) => Arc::new(s),
            Ok(None) => {
                tracing::debug!(%version, "no manifest for a read ticket");
                return None;
            }
            Err(e) => {
                tracing::warn!(%version, error = %e, "a read ticket's manifest cannot be read");
                return None;
            }
        };
        let mut sets = locks::lock(&self.sets);
        if sets.len() >= VERSIONS_KEPT {
            sets.clear();
        }
        sets.insert(*version, set.clone());
        Some(set)
    }
}

/// The distinct blocks of `version`; `None` where the store holds no such version.
pub(super) fn blocks_of(
    meta: &MetaStore,
    version: &Version,
) -> Result<Option<HashSet<BlockHash>>, MetaError> {
    Ok(meta.manifest_if_any(&version.0)?.map(|m| {
        m.entries
            .iter()
            .flat_map(|e| e.blocks.iter())
            .filter_map(crate::manifest::block_hash)
            .collect()
    }))
}

impl VersionBlocks for ManifestBlocks {
    fn holds(&self, version: &Version, hash: &BlockHash) -> bool {
        self.set_of(version).is_some_and(|s| s.contains(hash))
    }

    fn known(&self, version: &Version, hash: &BlockHash) -> Option<bool> {
        locks::lock(&self.sets)
            .get(version)
            .map(|s| s.contains(hash))
    }
}

#[cfg(test)]
mod epoch_tests {
    use super::*;

    const DAY: u64 = 24 * 3600;

    #[test]
    fn a_key_signs_a_day_its_successor_announced_first_and_the_one_before_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = 1_000_000;
        let keys = TicketKeys::load_at(dir.path(), token_mark(Some("a")), t0).unwrap();
        let first = keys.verifiers().get();
        assert_eq!(first.iter().map(|v| v.epoch()).collect::<Vec<_>>(), vec![1]);
        let t1 = keys.issue(&Grant::Node, NODE_TTL_FOR_TEST);
        // Not due yet.
        assert!(!keys.rotate_at(t0 + DAY / 2).unwrap());
        // Announced before it signs: epoch 2 is checked everywhere while 1 still signs.
        let announce = t0 + DAY - ANNOUNCE.as_secs();
        assert!(keys.rotate_at(announce).unwrap());
        let v = keys.verifiers();
        assert_eq!(
            v.get().iter().map(|v| v.epoch()).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(locks::lock(&keys.epochs).signing(announce).key.epoch(), 1);
        assert_eq!(locks::lock(&keys.epochs).signing(t0 + DAY).key.epoch(), 2);
        assert_eq!(v.verify(&t1), Ok(Grant::Node));
        // Two days on: epoch 3 announced, 2 signs, 1 retired; its tickets are refused by name.
        assert!(keys.rotate_at(t0 + 2 * DAY - ANNOUNCE.as_secs()).unwrap());
        assert!(keys.rotate_at(t0 + 2 * DAY).unwrap());
        assert_eq!(
            v.get().iter().map(|v| v.epoch()).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert_eq!(
            v.verify(&t1),
            Err(crate::auth::ticket::TicketError::Retired(1))
        );
        // Kept across a restart with the same token.
        let again = TicketKeys::load_at(dir.path(), token_mark(Some("a")), t0 + 2 * DAY).unwrap();
        assert_eq!(again.verifiers().get(), v.get());
    }

    #[test]
    fn a_changed_shared_token_retires_every_epoch_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let keys = TicketKeys::load_at(dir.path(), token_mark(Some("a")), 5_000).unwrap();
        let old = keys.issue(&Grant::Node, NODE_TTL_FOR_TEST);
        assert_eq!(keys.verifiers().verify(&old), Ok(Grant::Node));
        let keys = TicketKeys::load_at(dir.path(), token_mark(Some("b")), 5_010).unwrap();
        let v = keys.verifiers();
        assert_eq!(
            v.get().iter().map(|v| v.epoch()).collect::<Vec<_>>(),
            vec![2]
        );
        assert_eq!(
            v.verify(&old),
            Err(crate::auth::ticket::TicketError::Retired(1))
        );
        assert_eq!(
            v.verify(&keys.issue(&Grant::Node, NODE_TTL_FOR_TEST)),
            Ok(Grant::Node)
        );
        // A file that is not one is an error, not a fresh key.
        std::fs::write(dir.path().join(EPOCHS_FILE), "key 1 2\n").unwrap();
        assert!(TicketKeys::load_at(dir.path(), token_mark(Some("b")), 5_020).is_err());
    }

    /// Replicas that share a secret sign and check with the same keys, epoch by epoch, with
    /// nothing on disk: a ticket one gave holds at another, across a rotation too; another
    /// secret's, or another shared token's, does not.
    #[test]
    fn replicas_sharing_a_secret_honour_each_others_tickets() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, "0123456789abcdef0123456789abcdef\n").unwrap();
        let secret = SharedSecret::read(&file).unwrap();
        let mark = token_mark(Some("t"));
        let t0 = 20_000 * DAY + DAY / 2;
        let a = TicketKeys::shared_at(secret.clone(), mark, t0);
        let b = TicketKeys::shared_at(secret.clone(), mark, t0 + 60);
        let from_a = a.issue(&Grant::Node, NODE_TTL_FOR_TEST);
        assert_eq!(b.verifiers().verify(&from_a), Ok(Grant::Node));
        assert_eq!(
            secret.gpu_key().as_bytes(),
            SharedSecret::read(&file).unwrap().gpu_key().as_bytes()
        );
        // The next epoch is announced, then signs; the one before still holds.
        assert!(!b.rotate_at(t0 + DAY / 4).unwrap());
        let announce = t0 + DAY / 2 - ANNOUNCE.as_secs();
        assert!(b.rotate_at(announce).unwrap());
        let next = 20_002;
        assert_eq!(
            locks::lock(&b.epochs).numbers(),
            vec![next - 2, next - 1, next]
        );
        assert!(b.rotate_at(t0 + DAY / 2).unwrap());
        assert_eq!(
            locks::lock(&b.epochs).signing(t0 + DAY / 2).key.epoch(),
            next
        );
        let from_b = b.issue(&Grant::Node, NODE_TTL_FOR_TEST);
        assert!(a.rotate_at(t0 + DAY / 2 + 1).unwrap());
        assert_eq!(a.verifiers().verify(&from_b), Ok(Grant::Node));
        assert_eq!(b.verifiers().verify(&from_a), Ok(Grant::Node));
        // Another secret, or another shared token: other keys.
        std::fs::write(&file, "another secret, long enough to be one").unwrap();
        let other = TicketKeys::shared_at(SharedSecret::read(&file).unwrap(), mark, t0);
        assert!(other.verifiers().verify(&from_a).is_err());
        let retoken = TicketKeys::shared_at(secret, token_mark(Some("u")), t0);
        assert!(retoken.verifiers().verify(&from_a).is_err());
        // A secret too short to be one is refused.
        std::fs::write(&file, "short\n").unwrap();
        assert!(SharedSecret::read(&file).is_err());
    }

    const NODE_TTL_FOR_TEST: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);
}
