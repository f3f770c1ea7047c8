//! Who a job talks to: the store server and the peers it fetches from. By default a job
//! connects to the store server at its address and reaches peers over TCP with a pool of its
//! own; a caller may hand it others (a test's failing store or lying peer, cluster mode's
//! router in front of several store servers).

use crate::auth::Credential;
use crate::dataplane::peers::Peers;
use crate::rpc::client::{self, ClientError, Store};

#[derive(Clone, Default)]
pub struct Remotes {
    /// The store server; `None`: connect to the job's `server`.
    pub store: Option<Store>,
    pub peers: Peers,
}

impl Remotes {
    pub fn new(store: Store, peers: Peers) -> Remotes {
        Remotes {
            store: Some(store),
            peers,
        }
    }

    /// The store server: the one given, or a new connection to `server` presenting
    /// `credential`.
    pub async fn store(&self, server: &str, credential: &Credential) -> Result<Store, ClientError> {
        match &self.store {
            Some(s) => Ok(s.clone()),
            None => client::connect_store(server, credential).await,
        }
    }

    /// The store server, connecting on first use (for long-lived callers: a mount).
    pub fn store_lazy(&self, server: &str, credential: &Credential) -> Result<Store, ClientError> {
        match &self.store {
            Some(s) => Ok(s.clone()),
            None => client::store_lazy(server, credential),
        }
    }
}
