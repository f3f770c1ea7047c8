//! The credential of the GPU host transport, which the store server issues.
//!
//! A worker serves a registration's bytes only to a worker that proves it holds the
//! registration's secret, and both then seal every frame with keys drawn from it (see
//! `gpu::worker::host`). The secret is the store server's to give: a keyed BLAKE3 of the
//! namespace, the publisher's node and its registration under a host key derived from a seed the
//! server keeps ([`host_key_of`]; no node holds it) (the namespace too, so that a key published
//! in one namespace naming another's registration gives no secret of it). The server hands it
//! out only in answers that checked the caller's namespace (a GPU key's resolve, a GPU window's
//! plan), and to the publisher's own agent for each of its node's registrations
//! (`RegistrationSecret`, its own node only). A cluster without authentication has no host key
//! and no secrets: there a registration id alone (64 random bits) reaches the bytes.

/// A registration's secret.
pub type Secret = [u8; 32];

/// What the store server derives registrations' secrets from: a key derived from its seed.
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
    }
}
