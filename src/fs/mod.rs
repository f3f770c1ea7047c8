//! The filesystem core behind the mount: what `/kt` shows and does, driven by the FUSE adapter
//! ([`fuse`]) and by tests alike, without a mount.
//!
//! Paths are keys of one namespace (the mount's root is the namespace). [`FsCore`]
//! ([`filesystem`]) composes the owners of its parts:
//!
//! - the namespace as this mount sees it ([`names`]): the kernel's inode numbers, and the store
//!   server's listings, cached for [`LISTING_TTL`] or for as long as the mount's [`watch`] holds
//!   its lease (the server then tells it of every change before the change's writer is
//!   answered);
//! - the open files ([`handles`]);
//! - reading ([`read`]): a read resolves the version at `open` (close-to-open consistency) and
//!   fetches only the blocks it touches;
//! - writing ([`write`]): a write is staged on local disk and published when closed or fsynced,
//!   or queued and published in the background under write-back;
//! - the GPU control tree under `/.gpu` ([`gpu_tree`]).
//!
//! The kernel's operations, which use several owners, are in [`ops`]. The core is async: every
//! call that waits on the store server or a peer awaits. Every operation returns plain structs
//! ([`attr`]) or an [`FsError`], whose errno [`error`] decides. [`session`] mounts, resumes and
//! unmounts; it and [`fuse`] are the only files that name fuser.

pub mod attr;
pub mod config;
pub mod error;
pub mod filesystem;
pub mod fuse;
pub mod gpu_tree;
pub mod handles;
pub mod kernel;
pub mod names;
pub mod ops;
pub mod paths;
pub mod read;
pub mod session;
mod watch;
pub mod write;

pub use attr::{Attr, Caller, DirEntry, Kind};
pub use config::FsConfig;
pub use error::{FsError, FsResult};
pub use filesystem::FsCore;
pub use kernel::{KernelCache, LEASED_TTL, LEASE_MARGIN, SETTLE_NAMES, UNLEASED_TTL};
pub use names::listings::LISTING_TTL;
pub use read::file::{PageCache, BYPASS_MIN};
