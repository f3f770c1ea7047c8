//! The fence of a store that several replicas serve: the one that owns it writes only while the
//! owner key still names it. Every transaction it sends compares the owner key's revision with
//! the one its claim wrote, so a replica that lost its claim (its lease expired while it was
//! paused, or cut off) commits nothing, whatever it still believes (doc/cluster.md, Replicas).

use std::sync::RwLock;

use tokio::sync::watch;

use super::seam::{Compare, EngineError, Revision};

/// Where the owner's claim lies, beside the tables (whose keys begin with their tag).
pub const OWNER_KEY: &[u8] = b"owner";

/// The claim a replica's transactions must still hold, and word of its loss.
pub struct Fence {
    held: RwLock<Option<Compare>>,
    broken: watch::Sender<bool>,
}

impl Default for Fence {
    fn default() -> Self {
        Fence {
            held: RwLock::new(None),
            broken: watch::channel(false).0,
        }
    }
}

impl Fence {
    /// From now on every transaction compares the owner key with `claimed`, the revision at
    /// which this replica's claim was written.
    pub fn hold(&self, claimed: Revision) {
        *self.held.write().unwrap_or_else(|p| p.into_inner()) = Some(Compare {
            key: OWNER_KEY.to_vec(),
            modified: claimed,
        });
    }

    /// The compare a transaction carries, or why this replica may not write.
    pub(super) fn compare(&self) -> Result<Compare, EngineError> {
        if *self.broken.borrow() {
            return Err(EngineError::NotOwner(
                "another replica took the store over".into(),
            ));
        }
        self.held
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| EngineError::NotOwner("it stands by".into()))
    }

    /// A transaction's compare of the owner key failed: another replica owns the store now.
    pub fn broke(&self) {
        self.broken.send_replace(true);
    }

    /// Waits until the claim is found lost (by a transaction or by the claim's keeper).
    pub async fn broken(&self) {
        let mut rx = self.broken.subscribe();
        // The sender lives as long as `self`, so the wait ends only when it says so.
        let _ = rx.wait_for(|b| *b).await;
    }

    pub fn is_broken(&self) -> bool {
        *self.broken.borrow()
    }
}
