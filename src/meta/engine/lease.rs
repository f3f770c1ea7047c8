//! Keeping an etcd lease alive: the store's claim (`owner`) and a replica's shards (`shards`)
//! each live under one.

use std::time::Duration;

use etcd_client::{LeaseKeepAliveStream, LeaseKeeper};

use super::members::{fault, Members};
use super::seam::EngineError;

/// One renewal of `lease` (on `stream`, opened on the first): whether it still lives.
pub(super) async fn renew(
    members: &Members,
    stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    lease: i64,
    ttl: Duration,
) -> Result<bool, EngineError> {
    if stream.is_none() {
        let opened = members
            .call(|mut c| async move {
                match c.lease_keep_alive(lease).await {
                    Ok(opened) => Ok(Some(opened)),
                    Err(etcd_client::Error::LeaseKeepAliveError(m)) if m.contains("not found") => {
                        Ok(None)
                    }
                    Err(e) => Err(e),
                }
            })
            .await?;
        let lives = opened.is_some();
        *stream = opened;
        return Ok(lives);
    }
    let Some((keeper, answers)) = stream.as_mut() else {
        return Err(EngineError::Unavailable("no renewal stream".into()));
    };
    keeper.keep_alive().await.map_err(fault)?;
    let answer = tokio::time::timeout(ttl / 2, answers.message())
        .await
        .map_err(|_| EngineError::Unavailable("a renewal was not answered".into()))?
        .map_err(fault)?
        .ok_or_else(|| EngineError::Unavailable("the renewal stream ended".into()))?;
    Ok(answer.ttl() > 0)
}
