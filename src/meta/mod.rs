//! The store server's metadata: keys, manifests, locations and node leases.
//!
//! Keys, manifests and locations live in a [`MetaBackend`] (RocksDB today) and survive a
//! restart; node leases live in memory ([`nodes`]). Every change is planned against a view that
//! sees its own pending edits and written in one atomic batch (`txn`), so a reader sees the
//! old version or the new one, never half of a put. Concurrent changes are made durable in
//! batches, one sync each (`commit`), and a change returns only once it is durable; until then
//! only changes planned after it see it. Time (TTLs, leases) comes from the injected clock.
//!
//! [`MetaStore`] and its construction are in `store`; its methods are in the files of their
//! concern: reads of the stored state (`reads`), publishing (`publish`), lookups and listings
//! (`resolve`, `list`), changes of names (`names`) and attributes (`attrs`), nodes and
//! locations (`locations`), GPU keys (`gpu`), the namespaces' references to blocks
//! (`references`) and garbage collection ([`gc`], what it keeps for a grace in `graveyard`).

mod ancestry;
mod attrs;
pub mod backend;
pub mod collected;
mod commit;
pub mod engine;
mod error;
pub mod gc;
pub mod gc_peers;
mod gc_shared;
mod gpu;
mod graveyard;
mod keys;
mod list;
mod locations;
mod names;
pub mod nodes;
mod publish;
mod reads;
mod references;
mod resolve;
pub mod small_blocks;
mod store;
mod txn;

#[cfg(test)]
mod commit_tests;
#[cfg(test)]
mod gc_shared_tests;
#[cfg(test)]
mod gc_tests;
#[cfg(test)]
mod list_tests;
#[cfg(test)]
mod read_ahead_tests;
#[cfg(test)]
mod references_tests;
#[cfg(test)]
mod tests;

pub use backend::{BackendError, MetaBackend, FAMILIES};
pub use commit::{refusal, CommitStats, Refusal, Ticket};
pub use error::MetaError;
pub use publish::Publish;
pub use reads::Page;
pub(crate) use reads::View;
pub use references::{Rebuilt, TableRefs};
pub use resolve::Resolved;
pub use small_blocks::TableBlocks;
pub use store::MetaStore;
pub use txn::Loc;
