//! The one lock-poisoning policy: a poisoned lock is taken anyway.
//!
//! A `std::sync::Mutex` is poisoned when a thread panics while holding it. Every critical
//! section in ktfs changes its data in steps that each leave it whole (a map entry inserted or
//! removed, a counter bumped, a file handle swapped), so the data behind a poisoned lock is as
//! valid as it was before the panic. Refusing it would turn one panicked FUSE request into EIO
//! for every later request on the mount, or one failed RPC handler into a dead store server.
//! The panic itself is still reported where it happened (tokio and the FUSE threads log it).

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_poisoned_lock_is_taken_with_its_data() {
        let m = Arc::new(Mutex::new(7));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 7);
    }
}
