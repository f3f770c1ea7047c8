//! Who may do what, and how each side proves it: what a caller presents to the store server
//! ([`credential`], and a node's own token where there is no Kubernetes: [`node_token`]), the
//! data plane's tickets the store server signs ([`ticket`]), the secret of a GPU registration
//! and the sealed frames of the GPU host transport ([`gpu_secret`], [`sealed`]), and TLS on
//! every connection ([`tls`]).
//!
//! These are the credentials and their checks; the store server's enforcement of them on each
//! route (who a token belongs to, which namespace it may touch) is the server's own auth layer,
//! which uses this module.

pub mod credential;
pub mod gpu_secret;
pub mod node_token;
pub mod sealed;
pub mod ticket;
pub mod tls;

pub use credential::Credential;
