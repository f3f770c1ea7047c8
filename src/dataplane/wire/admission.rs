//! Connections that have shown no ticket, capped: in all and per address. A caller with no
//! ticket may open a connection and say nothing, and each costs a descriptor and buffers;
//! measured on a 1,024-descriptor limit, 1,100 idle connections made a legitimate GET fail
//! ("Too many open files"). Under the caps such callers lock out only each other: a connection
//! that shows a ticket the gate admits leaves the count.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::locks::lock;

/// Connections without a ticket, in all.
pub const MAX_UNTICKETED: usize = 256;
/// Connections without a ticket from one address.
pub const MAX_UNTICKETED_PER_ADDR: usize = 32;

/// The count of a server's connections that have shown no ticket, by address.
#[derive(Default)]
pub struct Admission {
    counts: Mutex<Counts>,
    caps: Caps,
}

#[derive(Default)]
struct Counts {
    all: usize,
    by_addr: HashMap<Option<IpAddr>, usize>,
}

#[derive(Clone, Copy)]
struct Caps {
    all: usize,
    per_addr: usize,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            all: MAX_UNTICKETED,
            per_addr: MAX_UNTICKETED_PER_ADDR,
        }
    }
}

impl Admission {
    /// Caps other than the defaults (for tests).
    pub fn with_caps(all: usize, per_addr: usize) -> Self {
        Admission {
            counts: Mutex::default(),
            caps: Caps { all, per_addr },
        }
    }

    /// A place for a new connection from `addr`, or `None` where the caps are reached.
    pub fn enter(self: &Arc<Self>, addr: Option<IpAddr>) -> Option<Unticketed> {
        let mut c = lock(&self.counts);
        let from = c.by_addr.get(&addr).copied().unwrap_or(0);
        if c.all >= self.caps.all || from >= self.caps.per_addr {
            return None;
        }
        c.all += 1;
        *c.by_addr.entry(addr).or_default() += 1;
        Some(Unticketed {
            admission: self.clone(),
            addr,
        })
    }

    /// Connections counted now.
    pub fn count(&self) -> usize {
        lock(&self.counts).all
    }
}

/// A connection's place among those without a ticket, given back when dropped.
pub struct Unticketed {
    admission: Arc<Admission>,
    addr: Option<IpAddr>,
}

impl Drop for Unticketed {
    fn drop(&mut self) {
        let mut c = lock(&self.admission.counts);
        c.all -= 1;
        if let Some(n) = c.by_addr.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                c.by_addr.remove(&self.addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_hold_in_all_and_per_address_and_a_place_given_back_is_free_again() {
        let a = Arc::new(Admission::with_caps(3, 2));
        let one: IpAddr = "127.0.0.1".parse().unwrap();
        let two: IpAddr = "127.0.0.2".parse().unwrap();
        let first = a.enter(Some(one)).unwrap();
        let _second = a.enter(Some(one)).unwrap();
        assert!(a.enter(Some(one)).is_none(), "a third from one address");
        let _third = a.enter(Some(two)).unwrap();
        assert!(a.enter(Some(two)).is_none(), "a fourth in all");
        drop(first);
        assert_eq!(a.count(), 2);
        assert!(a.enter(Some(one)).is_some());
    }
}
