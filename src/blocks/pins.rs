//! The versions open on this node: a file a mount holds open pins its version until the last
//! handle to it is released. The node tells the store with every heartbeat, and garbage
//! collection keeps those versions whole, though no key names them any more.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::hash::Version;
use crate::locks::lock;

#[derive(Clone, Default)]
pub struct Pins(Arc<Mutex<HashMap<Version, usize>>>);

/// One opener's hold on a version; released when dropped.
pub struct Pin {
    pins: Pins,
    version: Version,
}

impl Pins {
    pub fn pin(&self, version: Version) -> Pin {
        *lock(&self.0).entry(version).or_default() += 1;
        Pin {
            pins: self.clone(),
            version,
        }
    }

    /// Every version pinned now.
    pub fn versions(&self) -> Vec<Version> {
        lock(&self.0).keys().copied().collect()
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut pins = lock(&self.pins.0);
        if let Some(n) = pins.get_mut(&self.version) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&self.version);
            }
        }
    }
}

impl std::fmt::Debug for Pin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pin({})", self.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_stays_pinned_until_its_last_opener_lets_go() {
        let pins = Pins::default();
        let (a, b) = (Version([1; 32]), Version([2; 32]));
        let first = pins.pin(a);
        let second = pins.pin(a);
        let other = pins.pin(b);
        drop(first);
        let mut now = pins.versions();
        now.sort_by_key(|v| v.0);
        assert_eq!(now, vec![a, b]);
        drop(second);
        assert_eq!(pins.versions(), vec![b]);
        drop(other);
        assert!(pins.versions().is_empty());
    }
}
