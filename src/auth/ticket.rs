//! Tickets: the credentials of the data plane. The store server, which checked who a caller is
//! on the control plane, hands out tickets for what the caller may then do with blocks:
//!
//! - [`Grant::Read`] of one version, with every resolve: the blocks of that version;
//! - [`Grant::Write`], with the question which blocks the store lacks: uploads to the store,
//!   which the store records as referenced by the ticket's namespace (its [`Scope`]);
//! - [`Grant::Node`], to node agents when they register and heartbeat: any block, both ways.
//!
//! A ticket is its grant, an expiry, the epoch of the key that signed it and an Ed25519
//! signature by that key. The store server's signing key is rotated (daily, and whenever its
//! shared token changes; the server keeps the epochs in its data directory); node agents receive the public
//! halves of the epochs in force when they register and with every heartbeat
//! ([`TicketVerifiers`]), so a peer checks tickets without asking the server, a ticket dies with
//! its epoch, and no node can mint one. Both check that a block
//! served under a read ticket is one of that version's: the store from the version's manifest, a
//! node agent from the block set the store tells it. A server without authentication issues
//! none and asks for none.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::hash::{BlockHash, Scope, Version};

/// How long a read ticket holds: a `kt get` of a very large key must finish within it.
pub const READ_TTL: Duration = Duration::from_secs(6 * 3600);
/// How long an upload ticket holds.
pub const WRITE_TTL: Duration = Duration::from_secs(3600);
/// How long a node's ticket holds; every heartbeat brings a new one.
pub const NODE_TTL: Duration = Duration::from_secs(24 * 3600);
/// Clocks of nodes may differ by this much.
const SKEW: u64 = 300;

const KIND_READ: u8 = 1;
const KIND_WRITE: u8 = 2;
const KIND_NODE: u8 = 3;
/// What a ticket's signature covers: kind, the signing key's epoch, expiry, version (or scope).
const BODY_LEN: usize = 1 + 4 + 8 + 32;
/// The body, then its Ed25519 signature.
pub const TICKET_LEN: usize = BODY_LEN + 64;

/// What a ticket allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grant {
    Read(Version),
    /// Uploads, referenced in the namespace of the scope.
    Write(Scope),
    Node,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TicketError {
    #[error("a ticket of {0} bytes, not {TICKET_LEN}")]
    Length(usize),
    #[error("the ticket was not issued by this cluster's store server")]
    Forged,
    #[error("the ticket was signed with a key retired since (epoch {0}): ask for a new one")]
    Retired(u32),
    #[error("the ticket expired")]
    Expired,
    #[error("unknown ticket kind {0}")]
    Kind(u8),
}

/// The secret tickets are made with: the seed of one epoch of the store server's Ed25519 key,
/// which no node holds.
#[derive(Clone)]
pub struct TicketKey {
    seed: [u8; 32],
    pair: std::sync::Arc<ring::signature::Ed25519KeyPair>,
    epoch: u32,
}

/// What checks the tickets of one epoch: the public half of its key, which nodes receive.
#[derive(Clone, PartialEq, Eq)]
pub struct TicketVerifier {
    epoch: u32,
    key: [u8; 32],
}

impl std::fmt::Debug for TicketVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TicketVerifier({}: {})",
            self.epoch,
            &crate::hash::BlockHash(self.key).hex()[..16]
        )
    }
}

impl std::fmt::Debug for TicketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TicketKey(..)")
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl TicketKey {
    /// The key of epoch 1 from `b`, a seed.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        Self::of_epoch(b, 1)
    }

    /// The key of `epoch` from `b`, a seed.
    pub fn of_epoch(b: &[u8], epoch: u32) -> Option<Self> {
        let seed: [u8; 32] = b.try_into().ok()?;
        // Any 32 bytes are a seed; the check `from_seed_and_public_key` adds needs a public key
        // to check against, and there is none.
        let pair = ring::signature::Ed25519KeyPair::from_seed_unchecked(&seed).ok()?;
        Some(TicketKey {
            seed,
            pair: std::sync::Arc::new(pair),
            epoch,
        })
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.seed
    }

    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The public half, which checks what this key signs.
    pub fn verifier(&self) -> TicketVerifier {
        use ring::signature::KeyPair;
        let mut key = [0u8; 32];
        key.copy_from_slice(self.pair.public_key().as_ref());
        TicketVerifier {
            epoch: self.epoch,
            key,
        }
    }

    /// A secret for what nodes must share and tickets must not depend on (the GPU
    /// registrations' secrets): derived from this key, so that holding it mints no ticket.
    pub fn derived(&self, context: &str) -> [u8; 32] {
        blake3::derive_key(context, &self.seed)
    }

    /// A ticket for `grant`, valid for `ttl` from now.
    pub fn issue(&self, grant: &Grant, ttl: Duration) -> Bytes {
        self.issue_at(grant, unix_now() + ttl.as_secs())
    }

    /// A ticket for `grant` that holds until `expires` (seconds since the epoch).
    pub fn issue_at(&self, grant: &Grant, expires: u64) -> Bytes {
        let (kind, version) = match grant {
            Grant::Read(v) => (KIND_READ, v.0),
            Grant::Write(scope) => (KIND_WRITE, scope.0),
            Grant::Node => (KIND_NODE, [0u8; 32]),
        };
        let mut t = Vec::with_capacity(TICKET_LEN);
        t.push(kind);
        t.extend_from_slice(&self.epoch.to_be_bytes());
        t.extend_from_slice(&expires.to_be_bytes());
        t.extend_from_slice(&version);
        let sig = self.pair.sign(&t);
        t.extend_from_slice(sig.as_ref());
        Bytes::from(t)
    }

    /// What `ticket` allows, if this key made it and it holds now.
    pub fn verify(&self, ticket: &[u8]) -> Result<Grant, TicketError> {
        self.verifier().verify(ticket)
    }
}

/// When a ticket says it expires (seconds since the epoch), unchecked: for messages and tests;
/// only [`TicketVerifiers::verify`] says whether it holds.
pub fn expires_at(ticket: &[u8]) -> Option<u64> {
    epoch_of(ticket).ok()?;
    Some(u64::from_be_bytes(ticket[5..13].try_into().ok()?))
}

/// The epoch a ticket says it was signed in, if it is a ticket's length.
fn epoch_of(ticket: &[u8]) -> Result<u32, TicketError> {
    if ticket.len() != TICKET_LEN {
        return Err(TicketError::Length(ticket.len()));
    }
    let b: [u8; 4] = ticket[1..5].try_into().map_err(|_| TicketError::Forged)?;
    Ok(u32::from_be_bytes(b))
}

impl TicketVerifier {
    pub fn from_bytes(epoch: u32, b: &[u8]) -> Option<Self> {
        Some(TicketVerifier {
            epoch,
            key: b.try_into().ok()?,
        })
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.key
    }

    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// What `ticket` allows, if the key this checks for made it and it holds now.
    pub fn verify(&self, ticket: &[u8]) -> Result<Grant, TicketError> {
        self.verify_at(ticket, unix_now())
    }

    fn verify_at(&self, ticket: &[u8], now: u64) -> Result<Grant, TicketError> {
        if epoch_of(ticket)? != self.epoch {
            return Err(TicketError::Forged);
        }
        let (body, sig) = ticket.split_at(BODY_LEN);
        ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, &self.key)
            .verify(body, sig)
            .map_err(|_| TicketError::Forged)?;
        let expires = u64::from_be_bytes(body[5..13].try_into().map_err(|_| TicketError::Forged)?);
        if expires + SKEW < now {
            return Err(TicketError::Expired);
        }
        let version: [u8; 32] = body[13..45].try_into().map_err(|_| TicketError::Forged)?;
        match body[0] {
            KIND_READ => Ok(Grant::Read(Version(version))),
            KIND_WRITE => Ok(Grant::Write(Scope(version))),
            KIND_NODE => Ok(Grant::Node),
            k => Err(TicketError::Kind(k)),
        }
    }
}

/// The verifiers of the epochs in force (the previous, the current and the next, as the store
/// server last said), shared by whoever checks tickets and replaced in place when it says
/// again: a rotation reaches every connection's checks at once.
#[derive(Clone, Debug, Default)]
pub struct TicketVerifiers(std::sync::Arc<std::sync::RwLock<Vec<TicketVerifier>>>);

impl TicketVerifiers {
    pub fn new(keys: Vec<TicketVerifier>) -> Self {
        TicketVerifiers(std::sync::Arc::new(std::sync::RwLock::new(keys)))
    }

    pub fn set(&self, keys: Vec<TicketVerifier>) {
        *crate::locks::write(&self.0) = keys;
    }

    pub fn get(&self) -> Vec<TicketVerifier> {
        crate::locks::read(&self.0).clone()
    }

    /// What `ticket` allows, if one of the epochs in force signed it and it holds now.
    pub fn verify(&self, ticket: &[u8]) -> Result<Grant, TicketError> {
        let epoch = epoch_of(ticket)?;
        let keys = crate::locks::read(&self.0);
        match keys.iter().find(|k| k.epoch == epoch) {
            Some(k) => k.verify(ticket),
            // An epoch older than any in force was retired; a newer one is no one's.
            None if keys.iter().any(|k| k.epoch > epoch) => Err(TicketError::Retired(epoch)),
            None => Err(TicketError::Forged),
        }
    }
}

/// Whether a server holds a version's block: the store answers from the version's manifest.
pub trait VersionBlocks: Send + Sync {
    /// May read the disk (a version's manifest).
    fn holds(&self, version: &Version, hash: &BlockHash) -> bool;

    /// [`VersionBlocks::holds`] when it is known without reading anything; `None` otherwise.
    fn known(&self, _version: &Version, _hash: &BlockHash) -> Option<bool> {
        None
    }
}

/// What a data-plane server asks of its callers.
#[derive(Clone)]
pub enum Gate {
    /// Nothing: a cluster without authentication.
    Open,
    /// Tickets `key` checks; with `versions`, a read ticket reaches only its version's blocks.
    Tickets {
        key: TicketVerifiers,
        versions: Option<std::sync::Arc<dyn VersionBlocks>>,
    },
    /// Nothing is served yet (an agent that has not learnt from the store server what to ask).
    Closed,
}

/// A server's gate, which an agent changes once the store server has said what to ask.
pub type SharedGate = std::sync::Arc<std::sync::RwLock<Gate>>;

pub fn shared(gate: Gate) -> SharedGate {
    std::sync::Arc::new(std::sync::RwLock::new(gate))
}

/// A ticket that is renewed while it is used (a node's, with every heartbeat); cloning shares it.
#[derive(Clone, Default)]
pub struct TicketHolder(std::sync::Arc<std::sync::RwLock<Bytes>>);

impl std::fmt::Debug for TicketHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TicketHolder(..)")
    }
}

impl TicketHolder {
    /// The ticket now; empty when there is none.
    pub fn get(&self) -> Bytes {
        crate::locks::read(&self.0).clone()
    }

    pub fn set(&self, ticket: Bytes) {
        *crate::locks::write(&self.0) = ticket;
    }
}

/// A data-plane operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Get,
    Put,
}

impl Gate {
    /// Whether a connection that presented `grants` may do `op` on `hash`; why not otherwise.
    pub fn allows(&self, grants: &[Grant], op: Op, hash: &BlockHash) -> Result<(), String> {
        let versions = match self {
            Gate::Open => return Ok(()),
            Gate::Closed => return Err("this node does not serve blocks yet".into()),
            Gate::Tickets { versions, .. } => versions,
        };
        let ok = grants.iter().any(|g| match (g, op) {
            (Grant::Node, _) | (Grant::Write(_), Op::Put) => true,
            (Grant::Read(v), Op::Get) => versions.as_ref().is_none_or(|vs| vs.holds(v, hash)),
            _ => false,
        });
        if ok {
            return Ok(());
        }
        Err(match op {
            Op::Get if grants.is_empty() => "no ticket: resolve the key for one".to_string(),
            Op::Get => format!("block {hash} is in no version this connection's tickets allow"),
            Op::Put => "no ticket to upload: ask the store which blocks it lacks".to_string(),
        })
    }

    /// [`Gate::allows`] where the answer needs no disk; `None` where a version's blocks must be
    /// read first (off the async threads).
    pub fn allows_now(
        &self,
        grants: &[Grant],
        op: Op,
        hash: &BlockHash,
    ) -> Option<Result<(), String>> {
        if let Gate::Tickets {
            versions: Some(vs), ..
        } = self
        {
            if op == Op::Get && !grants.contains(&Grant::Node) {
                let mut unknown = false;
                for g in grants {
                    if let Grant::Read(v) = g {
                        match vs.known(v, hash) {
                            Some(true) => return Some(Ok(())),
                            Some(false) => {}
                            None => unknown = true,
                        }
                    }
                }
                if unknown {
                    return None;
                }
            }
        }
        Some(self.allows(grants, op, hash))
    }

    /// Whether it serves anyone, ticket or not (a server without authentication).
    pub fn is_open(&self) -> bool {
        matches!(self, Gate::Open)
    }

    /// The grant of a ticket a connection presents.
    pub fn admit(&self, ticket: &[u8]) -> Result<Option<Grant>, TicketError> {
        match self {
            Gate::Tickets { key, .. } => key.verify(ticket).map(Some),
            Gate::Open | Gate::Closed => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_hold_what_they_grant_until_they_expire_and_cannot_be_forged() {
        let key = TicketKey::from_bytes(&[7; 32]).unwrap();
        let v = Version([9; 32]);
        for g in [Grant::Read(v), Grant::Write(Scope([3; 32])), Grant::Node] {
            let t = key.issue(&g, READ_TTL);
            assert_eq!(key.verify(&t), Ok(g));
        }
        let t = key.issue_at(&Grant::Node, 1000);
        let checks = key.verifier();
        assert_eq!(checks.verify_at(&t, 1000 + SKEW), Ok(Grant::Node));
        assert_eq!(checks.verify_at(&t, 1001 + SKEW), Err(TicketError::Expired));
        // Another key's ticket, a changed grant, a changed expiry, a cut ticket.
        let other = TicketKey::from_bytes(&[8; 32])
            .unwrap()
            .issue(&Grant::Node, NODE_TTL);
        assert_eq!(key.verify(&other), Err(TicketError::Forged));
        let mut t = key.issue(&Grant::Write(Scope([3; 32])), WRITE_TTL).to_vec();
        t[0] = KIND_NODE;
        assert_eq!(key.verify(&t), Err(TicketError::Forged));
        t[0] = KIND_WRITE;
        t[9] ^= 1;
        assert_eq!(key.verify(&t), Err(TicketError::Forged));
        assert_eq!(key.verify(&t[..10]), Err(TicketError::Length(10)));
        // What a node holds, the public half, mints nothing: a ticket made with it as a seed
        // is another key's.
        let minted = TicketKey::from_bytes(checks.as_bytes())
            .unwrap()
            .issue(&Grant::Node, NODE_TTL);
        assert_eq!(checks.verify(&minted), Err(TicketError::Forged));
    }

    #[test]
    fn verifiers_take_the_epochs_in_force_and_refuse_a_retired_one_by_name() {
        let keys: Vec<TicketKey> = (1..=4)
            .map(|e| TicketKey::of_epoch(&[e as u8; 32], e).unwrap())
            .collect();
        let verifiers = TicketVerifiers::new(keys[1..3].iter().map(TicketKey::verifier).collect());
        let t = |k: &TicketKey| k.issue(&Grant::Node, NODE_TTL);
        assert_eq!(verifiers.verify(&t(&keys[1])), Ok(Grant::Node));
        assert_eq!(verifiers.verify(&t(&keys[2])), Ok(Grant::Node));
        assert_eq!(verifiers.verify(&t(&keys[0])), Err(TicketError::Retired(1)));
        assert_eq!(verifiers.verify(&t(&keys[3])), Err(TicketError::Forged));
        // An epoch claimed by another key's ticket: its signature is not that epoch's.
        let liar = TicketKey::of_epoch(&[9; 32], 2).unwrap();
        assert_eq!(verifiers.verify(&t(&liar)), Err(TicketError::Forged));
        // Replaced in place: every clone sees the new epochs.
        let clone = verifiers.clone();
        verifiers.set(vec![keys[3].verifier()]);
        assert_eq!(clone.verify(&t(&keys[3])), Ok(Grant::Node));
        assert_eq!(clone.verify(&t(&keys[2])), Err(TicketError::Retired(3)));
    }

    struct Only(BlockHash);
    impl VersionBlocks for Only {
        fn holds(&self, _v: &Version, hash: &BlockHash) -> bool {
            *hash == self.0
        }
    }

    #[test]
    fn a_gate_lets_each_grant_do_its_own() {
        let mine = BlockHash::of(b"mine");
        let theirs = BlockHash::of(b"theirs");
        let gate = Gate::Tickets {
            key: TicketVerifiers::new(vec![TicketKey::from_bytes(&[1; 32]).unwrap().verifier()]),
            versions: Some(std::sync::Arc::new(Only(mine))),
        };
        let read = [Grant::Read(Version([2; 32]))];
        assert!(gate.allows(&read, Op::Get, &mine).is_ok());
        assert!(gate.allows(&read, Op::Get, &theirs).is_err());
        assert!(gate.allows(&read, Op::Put, &mine).is_err());
        assert!(gate.allows(&[], Op::Get, &mine).is_err());
        assert!(gate
            .allows(&[Grant::Write(Scope([3; 32]))], Op::Put, &theirs)
            .is_ok());
        assert!(gate
            .allows(&[Grant::Write(Scope([3; 32]))], Op::Get, &theirs)
            .is_err());
        assert!(gate.allows(&[Grant::Node], Op::Get, &theirs).is_ok());
        assert!(Gate::Open.allows(&[], Op::Put, &theirs).is_ok());
        assert!(Gate::Closed.allows(&[Grant::Node], Op::Get, &mine).is_err());
    }
}
