//! The mount's settings.

use std::path::PathBuf;

use crate::auth::ticket::TicketHolder;
use crate::auth::Credential;
use crate::clock::SharedClock;
use crate::key::Namespace;
use crate::proto::Locale;

/// The mount's settings.
#[derive(Clone, Debug)]
pub struct FsConfig {
    pub server: String,
    /// What the mount presents to the store server: its node's credential.
    pub credential: Credential,
    /// What it presents to peers on the data plane: its node's ticket, renewed by heartbeats.
    pub node_ticket: TicketHolder,
    pub namespace: Namespace,
    pub locale: Locale,
    pub read_only: bool,
    pub node_id: String,
    pub zone: String,
    /// Children per source for readers of one version (0: the server's default).
    pub fanout: u32,
    /// Where writes are staged until published (and where files published in place stay).
    pub staging: PathBuf,
    pub uid: u32,
    pub gid: u32,
    /// What listing lifetimes are measured with.
    pub clock: SharedClock,
    /// The `kt` binary, which GPU transfer workers run as (`kt gpu-worker`).
    pub worker_exe: PathBuf,
    /// The address this node's GPU transfer workers listen on.
    pub worker_host: String,
    /// Closes return once journaled; publishes follow (see [`writeback`]).
    pub writeback: bool,
    /// With no store server reachable, what this mount holds is still read (the listings and
    /// versions it last saw, the blocks it cached), and writes fail with EROFS until one
    /// answers again (doc/SEMANTICS.md, "Stale reads").
    pub stale_reads: bool,
}
