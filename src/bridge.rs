//! A runtime of its own for synchronous callers of an async client (the metadata engine, the
//! object store): a call waits on the caller's thread whatever thread that is, an async one
//! included, and the client's connections live on the runtime that made them.

use std::future::Future;

pub struct Bridge {
    /// `Some` until dropped: shut down without waiting, as a drop may come on an async thread.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Bridge {
    /// A runtime of one worker thread, named `name`.
    pub fn new(name: &str) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(name)
            .enable_all()
            .build()?;
        Ok(Bridge {
            runtime: Some(runtime),
        })
    }

    /// Runs `fut` on the runtime and waits for it; `None` if the runtime stopped first.
    pub fn run<T: Send + 'static>(
        &self,
        fut: impl Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        let runtime = self.runtime.as_ref()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().ok()
    }

    /// Starts `fut` on the runtime without waiting for it; false if the runtime stopped.
    pub fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) -> bool {
        match &self.runtime {
            Some(rt) => {
                rt.spawn(fut);
                true
            }
            None => false,
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
