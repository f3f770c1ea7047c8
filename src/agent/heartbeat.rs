//! The agent's lease with the store server: registered at start, renewed by heartbeat, and
//! registered again whenever the server does not know the node (a restarted server).

use std::time::Duration;

use crate::proto::{HeartbeatRequest, NodeInfo, RegisterNodeRequest};
use crate::rpc::{client, Credential};

/// Keeps this node's lease alive; registers again whenever the server does not know it (first
/// start, or the server restarted).
pub(super) async fn heartbeat_loop(
    server: String,
    credential: Credential,
    node: NodeInfo,
    every: Duration,
) {
    let mut registered = false;
    loop {
        match client::connect_store(&server, &credential).await {
            Ok(mut store) => loop {
                let ok = if registered {
                    match store
                        .heartbeat(HeartbeatRequest {
                            node_id: node.node_id.clone(),
                        })
                        .await
                    {
                        Ok(r) => {
                            registered = r.into_inner().known;
                            true
                        }
                        Err(e) => {
                            tracing::warn!(error = %e.message(), "heartbeat failed");
                            false
                        }
                    }
                } else {
                    match store
                        .register_node(RegisterNodeRequest {
                            node: Some(node.clone()),
                        })
                        .await
                    {
                        Ok(_) => {
                            registered = true;
                            true
                        }
                        Err(e) => {
                            tracing::warn!(error = %e.message(), "registering with the store server failed");
                            false
                        }
                    }
                };
                if !registered && ok {
                    continue;
                }
                tokio::time::sleep(every).await;
                if !ok {
                    break;
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "store server unreachable; retrying");
                registered = false;
                tokio::time::sleep(every).await;
            }
        }
    }
}
