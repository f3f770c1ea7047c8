//! The members of an etcd cluster, one client each. etcd's own client balances its requests
//! over every member it is given, and with one member down it kept sending some of them there:
//! measured, a store server given three members, one of them killed, failed at its start with
//! "tcp connect error" for more than 5 s. Any member answers (a follower forwards to the
//! leader), so a request goes to the member that answered last and, where that one cannot be
//! reached, to the next.
//!
//! A request that failed for want of a member may be sent again: a read does no harm, and a
//! transaction either compares what it read (it fails rather than applies twice) or puts and
//! deletes what it names, which applied twice leaves what applied once does.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use etcd_client::Client;

use super::etcd::{connect_one, fault, EtcdUrl};
use super::seam::EngineError;

pub(super) struct Members {
    url: EtcdUrl,
    /// Each member's client, made on first use (a member down at the start is tried later).
    clients: Mutex<Vec<Option<Client>>>,
    /// The member that answered last.
    at: AtomicUsize,
}

impl Members {
    pub fn new(url: &EtcdUrl) -> Self {
        Members {
            url: url.clone(),
            clients: Mutex::new(vec![None; url.endpoints.len()]),
            at: AtomicUsize::new(0),
        }
    }

    /// Member `i`'s client, connected now if it was not yet.
    async fn client(&self, i: usize) -> Result<Client, EngineError> {
        let known = crate::locks::lock(&self.clients)[i].clone();
        if let Some(c) = known {
            return Ok(c);
        }
        let c = connect_one(&self.url, &self.url.endpoints[i]).await?;
        crate::locks::lock(&self.clients)[i] = Some(c.clone());
        Ok(c)
    }

    /// `f` on a member's client: on the one that answered last, then on each other once while
    /// none can be reached.
    pub async fn call<T, F, Fut>(&self, mut f: F) -> Result<T, EngineError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.url.endpoints.len();
        let first = self.at.load(Ordering::Relaxed) % n;
        let mut failed = None;
        for i in (first..n).chain(0..first) {
            let answer = match self.client(i).await {
                Ok(c) => f(c).await.map_err(fault),
                Err(e) => Err(e),
            };
            match answer {
                Err(EngineError::Unavailable(why)) => {
                    tracing::debug!(member = %self.url.endpoints[i], error = %why, "trying another etcd member");
                    failed = Some(EngineError::Unavailable(why));
                }
                answered => {
                    self.at.store(i, Ordering::Relaxed);
                    return answered;
                }
            }
        }
        Err(failed.unwrap_or_else(|| EngineError::Unavailable("no etcd member".into())))
    }
}
