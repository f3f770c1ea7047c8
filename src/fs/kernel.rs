//! What the kernel caches of the mount, which the mount can make it forget, and how long the
//! kernel may trust names and attributes (see `doc/watch.md`).

use std::time::Duration;

/// What the kernel cached of the mount, which the mount can make it forget.
pub trait KernelCache: Send + Sync {
    /// The attributes of inode `ino` (its size, times, link count).
    fn forget_attrs(&self, ino: u64);
    /// The name `name` in directory `parent`, and below it: the next use looks it up again.
    /// Returns at once: the kernel takes the directory's lock to forget it, which a request in
    /// flight may hold while it waits for the change being told.
    fn forget_name(&self, parent: u64, name: &str);
    /// Waits until the names asked to be forgotten so far are, or `within` passed (a request
    /// holding a directory's lock may be waiting for the teller: it must go on).
    fn settle(&self, within: Duration);
}

/// How long the watch waits for the kernel to forget the names a change touched before it
/// acknowledges the change (see [`KernelCache::settle`]).
pub const SETTLE_NAMES: Duration = Duration::from_millis(50);

/// How long the kernel may trust names and attributes while the watch's lease holds: every
/// change another node makes is told (and forgotten in the kernel) before its writer is
/// answered, and a lease about to lapse makes the kernel forget everything first.
pub const LEASED_TTL: Duration = Duration::from_secs(30);
/// How long before the lease ends the kernel is made to forget, unless it was renewed: no reply
/// carries [`LEASED_TTL`] from then on.
pub const LEASE_MARGIN: Duration = Duration::from_millis(500);
/// Without a lease (no watch, or it broke), and for the GPU control tree (whose keys come and
/// go with their publishers, untold): short, so that changes elsewhere show up soon.
pub const UNLEASED_TTL: Duration = Duration::from_secs(1);
