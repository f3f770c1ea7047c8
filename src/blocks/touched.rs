//! What changed since the start of the previous pass of garbage collection (in the metadata
//! store), which a pass keeps whatever its mark saw: blocks uploaded or asked about, versions
//! published.

use std::collections::HashSet;
use std::hash::Hash;

/// What changed since the start of the previous pass, which a pass keeps. Empty and inert until
/// the first pass starts, so a server without collection keeps no such record.
pub struct Touched<T> {
    on: bool,
    current: HashSet<T>,
    previous: HashSet<T>,
}

impl<T: Eq + Hash> Default for Touched<T> {
    fn default() -> Self {
        Touched {
            on: false,
            current: HashSet::new(),
            previous: HashSet::new(),
        }
    }
}

impl<T: Eq + Hash> Touched<T> {
    pub fn touch(&mut self, t: T) {
        if self.on {
            self.current.insert(t);
        }
    }

    /// A pass starts: what the pass before it saw touched ages out. Returns whether anything
    /// was recorded before (a first pass has no record of what is in flight, and deletes
    /// nothing).
    pub fn rotate(&mut self) -> bool {
        let was_on = std::mem::replace(&mut self.on, true);
        self.previous = std::mem::take(&mut self.current);
        was_on
    }

    pub fn contains(&self, t: &T) -> bool {
        self.current.contains(t) || self.previous.contains(t)
    }

    pub fn all(&self) -> impl Iterator<Item = &T> {
        self.current.iter().chain(self.previous.iter())
    }
}
