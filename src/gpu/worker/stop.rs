//! How a transfer is stopped from outside (its registration let go of, its peer known gone):
//! the abort of its NCCL communicator, handed over once the communicator exists. Shared by
//! windows' broadcasts, pairs' GETs and the host transport's connections that carry an offer.

use std::sync::{Arc, Mutex};

use crate::locks::lock;

/// Stops a transfer from outside (its registration let go of, its peer known gone): the abort
/// of its communicator once there is one, or at once if it comes after the stop.
#[derive(Default)]
pub struct Stop(Mutex<StopState>);

pub type Abort = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct StopState {
    stopped: bool,
    done: bool,
    abort: Option<Abort>,
}

impl Stop {
    pub fn stop(&self) {
        let abort = {
            let mut st = lock(&self.0);
            st.stopped = true;
            st.abort.take()
        };
        if let Some(a) = abort {
            a();
        }
    }

    /// [`Stop::stop`] on a thread of its own: an abort waits for NCCL to wind the
    /// communicator down, which an async task must not.
    pub fn stop_in_background(self: &Arc<Self>) {
        if lock(&self.0).done {
            // Nothing to abort: the usual end of a pair's connection.
            return;
        }
        let me = self.clone();
        std::thread::spawn(move || me.stop());
    }

    /// How to stop the transfer, now that it runs.
    pub fn on_stop(&self, abort: Abort) {
        let mut st = lock(&self.0);
        if st.done {
            return;
        }
        if st.stopped {
            drop(st);
            abort();
        } else {
            st.abort = Some(abort);
        }
    }

    /// The transfer is over: a later stop must not touch its communicator, which is kept.
    pub fn done(&self) {
        let mut st = lock(&self.0);
        st.done = true;
        st.abort = None;
    }

    pub fn stopped(&self) -> bool {
        lock(&self.0).stopped
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU8, Ordering};

    use super::*;

    #[test]
    fn a_stop_before_the_communicator_forms_aborts_it_once_it_does_and_none_after_it_is_done() {
        let aborted = Arc::new(AtomicU8::new(0));
        let abort = || {
            let a = aborted.clone();
            Box::new(move || {
                a.fetch_add(1, Ordering::SeqCst);
            }) as Abort
        };
        let s = Stop::default();
        s.stop();
        s.on_stop(abort());
        assert_eq!(aborted.load(Ordering::SeqCst), 1);
        let s = Stop::default();
        s.on_stop(abort());
        s.stop();
        assert_eq!(aborted.load(Ordering::SeqCst), 2);
        // Done: the communicator is kept, and a late stop leaves it be.
        let s = Stop::default();
        s.on_stop(abort());
        s.done();
        s.stop();
        assert_eq!(aborted.load(Ordering::SeqCst), 2);
    }
}
