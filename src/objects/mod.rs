//! Object storage: where cluster mode keeps blocks and manifests (S3, GCS, Azure, or a directory
//! every replica mounts), through Apache Arrow's `object_store`. Objects are immutable and named
//! by content (a block by its hash, a manifest by its version), so a replica needs no index of
//! them and any replica reads what another wrote.
//!
//! The callers are synchronous (the store's block and metadata calls run on blocking threads),
//! so [`Objects`] runs its client on a runtime of its own and waits for each call on the
//! caller's thread.

mod store;
mod url;

pub use store::{ObjectError, Objects};
pub use url::{BadObjectUrl, ObjectUrl};
