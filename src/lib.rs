//! ktfs: a distributed data store for Kubernetes that its users see as a filesystem.
//!
//! A folder per concern, and dependencies that point one way (checked by `tests/layering.rs`):
//!
//! - the data model: [`hash`], [`key`], [`manifest`], the generated [`proto`], the [`clock`]
//!   seam, the [`locks`] policy, the process's [`metrics`], the
//!   optional [`tls`] of every connection, and [`db`], the one file that knows
//!   RocksDB;
//! - [`blocks`]: what the store and each node hold, and how they serve it;
//! - [`rpc`]: the control plane as both ends see it; [`k8s`]: what Kubernetes tells;
//!   [`swarm`]: the swarm's plain state machines, the server's board and a member's schedule;
//! - [`transfer`]: the data plane, publishing, fetching, broadcast membership, `put` and `get`;
//! - [`meta`] and [`broadcast`] below the store [`server`];
//! - [`keeper`] below the filesystem core [`fs`], below the node [`agent`].
//!
//! The `daemons` feature (on by default) builds the server, the agent and the mount; without
//! it, the library is the client that `put/get/ls/rm` need (no RocksDB, no FUSE): what a
//! laptop's `kt` and the Python package link.

pub mod proto {
    //! Generated control-plane messages and services (`proto/ktfs.proto`).
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("ktfs.v1");
}

pub mod clock;
pub mod hash;
pub mod key;
pub mod locks;
pub mod manifest;
pub mod metrics;

pub mod auth;
pub mod blocks;
pub mod broadcast;
pub mod dataplane;
pub mod gpu;
pub mod k8s;
pub mod rpc;
pub mod transfer;

#[cfg(feature = "daemons")]
pub mod agent;
#[cfg(feature = "daemons")]
pub mod bridge;
#[cfg(feature = "daemons")]
pub mod db;
#[cfg(feature = "daemons")]
pub mod fs;
#[cfg(feature = "daemons")]
pub mod keeper;
#[cfg(feature = "daemons")]
pub mod meta;
#[cfg(feature = "daemons")]
pub mod objects;
#[cfg(feature = "daemons")]
pub mod server;
