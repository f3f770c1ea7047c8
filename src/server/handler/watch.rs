//! A mount's watch of a namespace: registered with the server's watchers, its lease renewed and
//! its acknowledgements taken from what the mount sends, until its stream ends.

use tonic::{Request, Response, Status};

use super::state::StoreHandler;
use crate::proto::{WatchDown, WatchUp};
use crate::server::status::invalid;

/// What a watch answers: the changes of its namespace, as they are made.
pub(super) type WatchStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<WatchDown, Status>> + Send>>;

pub(super) async fn watch(
    handler: &StoreHandler,
    mut req: Request<tonic::Streaming<WatchUp>>,
) -> Result<Response<WatchStream>, Status> {
    let first = req
        .get_mut()
        .message()
        .await?
        .ok_or_else(|| invalid("a watch names its namespace in its first message"))?;
    let ns = handler.namespace_here(&req, &first.namespace)?;
    let (reg, rx) = handler
        .watchers
        .register(ns.as_str())
        .ok_or_else(|| Status::unavailable("the store server is shutting down"))?;
    // The first answer says the watcher's number (with the lease, or alone).
    let mut d = reg.up(first.acked, first.renew).unwrap_or_default();
    d.watcher = reg.id();
    reg.send(d);
    let mut inbound = req.into_inner();
    tokio::spawn(async move {
        // Until the watcher goes (its stream broke) or is dropped; `reg` unregisters it.
        loop {
            tokio::select! {
                up = inbound.message() => match up {
                    Ok(Some(up)) => {
                        if let Some(d) = reg.up(up.acked, up.renew) {
                            reg.send(d);
                        }
                    }
                    _ => break,
                },
                () = reg.ended() => break,
            }
        }
    });
    tracing::debug!(namespace = %ns, "a mount watches");
    Ok(Response::new(Box::pin(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    )))
}
