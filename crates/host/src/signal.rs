//! The signals that stop a daemon.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// Completes on Ctrl-C or SIGTERM, caught from the moment this is called, not from the
/// future's first poll: made before a daemon prints its ready line, so that a signal right
/// after that line (a test's, an orchestrator's) shuts it down as it should, where the default
/// action would kill it outright. Call it inside a tokio runtime.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    let (term, int) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let wait = |s: std::io::Result<Signal>| async move {
            match s {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = wait(term) => {}
            _ = wait(int) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// A SIGTERM after the handler was made but before anything polled it (a daemon between
    /// its ready line and its loop) is caught, where the default action would kill the process.
    #[tokio::test]
    async fn a_sigterm_before_the_first_poll_is_caught() {
        let stop = super::shutdown_signal();
        // SAFETY: signalling this very process, whose handler is installed above.
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        tokio::time::timeout(Duration::from_secs(10), stop)
            .await
            .expect("the SIGTERM was caught");
    }
}
