//! Node tokens: a credential per node for clusters that run on the shared token (`kt up`, bare
//! metal, no Kubernetes), where every holder of the shared token may act for every node.
//!
//! `kt node-token NODE` derives node NODE's token from the shared token, and the operator gives
//! each node agent its own instead of the shared one: the server recomputes it (no list of
//! nodes to keep), and a node's token acts for that node only, as a Kubernetes node agent's
//! bound token does. Leaking it costs that node's identity, not the cluster's: it cannot act for
//! another node, nor can anyone derive another node's token or the shared token from it.
//!
//! A token is `ktnode1.<64 hex digits>.<node>`: a keyed BLAKE3 hash of the node's name, under
//! a key derived from the shared token.

/// What every node token starts with.
pub const PREFIX: &str = "ktnode1.";

/// The longest node name a token carries (a Kubernetes node name, a DNS subdomain, is at most
/// 253 bytes).
const MAX_NODE: usize = 253;

const CONTEXT: &str = "ktfs 2026-12 node token v1";

/// Makes and checks the node tokens of one shared token.
pub struct NodeTokens {
    key: [u8; 32],
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NodeTokenError {
    #[error("a node token is `{PREFIX}<64 hex digits>.<node>`")]
    Malformed,
    #[error("a node name is 1 to {MAX_NODE} bytes without control characters")]
    BadNode,
    #[error("this node token was not made from this server's shared token")]
    Forged,
}

impl NodeTokens {
    /// The node tokens of `shared`, the shared token (surrounding whitespace ignored, as the
    /// server and clients read it).
    pub fn new(shared: &str) -> Self {
        NodeTokens {
            key: blake3::derive_key(CONTEXT, shared.trim().as_bytes()),
        }
    }

    fn mac(&self, node: &str) -> blake3::Hash {
        blake3::keyed_hash(&self.key, node.as_bytes())
    }

    /// Node `node`'s token.
    pub fn token_for(&self, node: &str) -> Result<String, NodeTokenError> {
        check_node(node)?;
        Ok(format!("{PREFIX}{}.{node}", self.mac(node).to_hex()))
    }

    /// The node `token` acts for; `None` when it is no node token at all.
    pub fn node_of<'t>(&self, token: &'t str) -> Option<Result<&'t str, NodeTokenError>> {
        let rest = token.strip_prefix(PREFIX)?;
        Some(self.check(rest))
    }

    fn check<'t>(&self, rest: &'t str) -> Result<&'t str, NodeTokenError> {
        let (hex, node) = rest.split_once('.').ok_or(NodeTokenError::Malformed)?;
        let given = blake3::Hash::from_hex(hex).map_err(|_| NodeTokenError::Malformed)?;
        check_node(node)?;
        // blake3::Hash compares in constant time.
        if given != self.mac(node) {
            return Err(NodeTokenError::Forged);
        }
        Ok(node)
    }
}

fn check_node(node: &str) -> Result<(), NodeTokenError> {
    if node.is_empty() || node.len() > MAX_NODE || node.chars().any(char::is_control) {
        return Err(NodeTokenError::BadNode);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_token_names_its_node_and_no_other() {
        let t = NodeTokens::new("s3cret\n");
        let n1 = t.token_for("n1").unwrap();
        assert!(n1.starts_with(PREFIX));
        assert_eq!(t.node_of(&n1), Some(Ok("n1")));
        // The same shared token read with or without its newline makes the same tokens.
        assert_eq!(NodeTokens::new("s3cret").node_of(&n1), Some(Ok("n1")));
        // Another node's name on n1's hash, another shared token's tokens, a changed digit.
        let swapped = n1.replace(".n1", ".n2");
        assert_eq!(t.node_of(&swapped), Some(Err(NodeTokenError::Forged)));
        let other = NodeTokens::new("another").token_for("n1").unwrap();
        assert_eq!(t.node_of(&other), Some(Err(NodeTokenError::Forged)));
        let mut flipped = n1.clone().into_bytes();
        flipped[PREFIX.len()] = if flipped[PREFIX.len()] == b'0' {
            b'1'
        } else {
            b'0'
        };
        let flipped = String::from_utf8(flipped).unwrap();
        assert_eq!(t.node_of(&flipped), Some(Err(NodeTokenError::Forged)));
        // Names with dots are names: the hash ends at the first dot.
        let dotted = t.token_for("node-1.zone-a").unwrap();
        assert_eq!(t.node_of(&dotted), Some(Ok("node-1.zone-a")));
    }

    #[test]
    fn anything_else_is_no_node_token_or_a_malformed_one() {
        let t = NodeTokens::new("s3cret");
        assert_eq!(t.node_of("s3cret"), None);
        assert_eq!(t.node_of("ktnode1."), Some(Err(NodeTokenError::Malformed)));
        assert_eq!(
            t.node_of("ktnode1.zz.n1"),
            Some(Err(NodeTokenError::Malformed))
        );
        let hex = "0".repeat(64);
        assert_eq!(
            t.node_of(&format!("ktnode1.{hex}.")),
            Some(Err(NodeTokenError::BadNode))
        );
        assert_eq!(
            t.node_of(&format!("ktnode1.{hex}.{}", "n".repeat(254))),
            Some(Err(NodeTokenError::BadNode))
        );
        assert_eq!(t.token_for(""), Err(NodeTokenError::BadNode));
        assert_eq!(t.token_for("a\nb"), Err(NodeTokenError::BadNode));
    }
}
