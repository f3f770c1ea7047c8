//! The credential of the GPU host transport, which the store server issues.
//!
//! A worker serves a registration's bytes only to a worker that proves it holds the
//! registration's secret, and both then seal every frame with keys drawn from it (see
//! `gpu::worker::host`). The secret is the store server's to give: a keyed BLAKE3 of the
//! namespace, the publisher's node and its registration under a key derived from the server's
//! ticket key ([`host_key_of`], which nodes receive; the ticket key, which signs tickets, they
//! do not) (the namespace too, so that a key published in one namespace naming another's
//! registration gives no secret of it). The
//! server hands it out only in answers that checked the caller's namespace (a GPU key's
//! resolve, a GPU window's plan); the publisher's own agent, which holds the host key as every
//! node agent does, derives it for its worker. A cluster without authentication has no ticket
//! key and no secrets: there a registration id alone (64 random bits) reaches the bytes.

use std::sync::{Arc, RwLock};

/// A registration's secret.
pub type Secret = [u8; 32];

/// What the store server derives registrations' secrets from, and hands to nodes: a key derived
/// from its ticket key, which mints no ticket.
pub fn host_key_of(ticket_key: &crate::auth::ticket::TicketKey) -> [u8; 32] {
    ticket_key.derived("ktfs 2026-12 GPU host transport host key")
}

const CONTEXT: &str = "ktfs 2026-12 GPU host transport registration secret";

/// The secret of `registration` in namespace `ns` of the worker on `node`, under the server's
/// ticket key.
pub fn registration_secret(
    ticket_key: &[u8; 32],
    ns: &str,
    node: &str,
    registration: u64,
) -> Secret {
    let key = blake3::derive_key(CONTEXT, ticket_key);
    let mut h = blake3::Hasher::new_keyed(&key);
    // Each name's length first: no two (namespace, node) pairs hash the same bytes.
    for name in [ns, node] {
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
    }
    h.update(&registration.to_le_bytes());
    *h.finalize().as_bytes()
}

/// The ticket key a node agent learnt at registration, shared by its mounts (clones share it):
/// empty while it has none, or where the cluster has no authentication.
#[derive(Clone, Default)]
pub struct HostKey(Arc<RwLock<Option<[u8; 32]>>>);

impl std::fmt::Debug for HostKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostKey(..)")
    }
}

impl HostKey {
    pub fn set(&self, ticket_key: Option<[u8; 32]>) {
        *crate::locks::write(&self.0) = ticket_key;
    }

    /// The secret of this node's `registration` in namespace `ns`, where the cluster issues
    /// them.
    pub fn secret(&self, ns: &str, node: &str, registration: u64) -> Option<Secret> {
        let key = *crate::locks::read(&self.0);
        key.map(|k| registration_secret(&k, ns, node, registration))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_belongs_to_one_key_namespace_node_and_registration() {
        let k = [7u8; 32];
        let s = registration_secret(&k, "a", "n1", 42);
        assert_eq!(s, registration_secret(&k, "a", "n1", 42));
        assert_ne!(s, registration_secret(&[8u8; 32], "a", "n1", 42));
        assert_ne!(s, registration_secret(&k, "b", "n1", 42));
        assert_ne!(s, registration_secret(&k, "a", "n2", 42));
        assert_ne!(s, registration_secret(&k, "a", "n1", 43));
        // Names do not run into each other.
        assert_ne!(
            registration_secret(&k, "ab", "c", 1),
            registration_secret(&k, "a", "bc", 1)
        );
        let host = HostKey::default();
        assert_eq!(host.secret("a", "n1", 42), None);
        host.clone().set(Some(k));
        assert_eq!(host.secret("a", "n1", 42), Some(s));
    }
}
