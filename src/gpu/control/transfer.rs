//! One transfer of a control file as STATUS reports it, and the wakers that poll(2) readiness
//! hands over, called once it finishes.

use std::sync::{Arc, Mutex};

use super::error::GpuError;
use crate::gpu::abi::{self, KtGpuStatus};
use crate::locks::lock;

/// Called once when a transfer finishes: the FUSE adapter's poll notification.
pub type Waker = Box<dyn FnOnce() + Send>;

/// One transfer of a control file, as STATUS reports it.
pub(super) struct Transfer {
    pub(super) id: u64,
    pub(super) status: Mutex<KtGpuStatus>,
    pub(super) wakers: Mutex<Vec<Waker>>,
}

impl Transfer {
    pub(super) fn new(id: u64, total: u64) -> Arc<Transfer> {
        Arc::new(Transfer {
            id,
            status: Mutex::new(KtGpuStatus {
                transfer: id,
                state: abi::PENDING,
                error: 0,
                bytes_done: 0,
                bytes_total: total,
                message: [0; 256],
            }),
            wakers: Mutex::default(),
        })
    }

    pub(super) fn finished(&self) -> bool {
        matches!(lock(&self.status).state, abi::DONE | abi::FAILED)
    }

    pub(super) fn set(&self, state: u32) {
        lock(&self.status).state = state;
    }

    pub(super) fn finish(&self, result: Result<u64, GpuError>) {
        {
            let mut st = lock(&self.status);
            match result {
                Ok(bytes) => {
                    st.state = abi::DONE;
                    st.bytes_done = bytes;
                }
                Err(e) => {
                    tracing::warn!(transfer = self.id, error = %e, "GPU transfer failed");
                    *st = st.clone().with_message(&e.to_string());
                    st.state = abi::FAILED;
                    st.error = e.errno();
                }
            }
        }
        for w in std::mem::take(&mut *lock(&self.wakers)) {
            w();
        }
    }
}
