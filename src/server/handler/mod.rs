//! The store server's gRPC handler: the service logic of the control plane, one file per
//! concern (watches; nodes and their heartbeats; blocks; publishing; resolving and listing;
//! changes of names; broadcast windows and their swarms; GPU windows). The handler's state and
//! what every part shares are in `state`; `service` answers each RPC of the `Store` service
//! with the function of its concern. Sockets and shutdown belong to
//! [`super::StoreServerProcess`].

mod blocks;
mod gpu;
mod inline;
mod names;
mod nodes;
mod publish;
mod read;
mod service;
mod state;
mod watch;
mod windows;

pub use state::StoreHandler;
