//! ktfs: a distributed data store for Kubernetes that its users see as a filesystem.
//!
//! The library holds everything the `kt` binary runs: keys and manifests, the RocksDB block and
//! metadata stores, the store server, the node agent, the data plane and the transfers. The CLI,
//! the FUSE mount and the CSI node all publish and fetch through the same calls here.

pub mod proto {
    //! Generated control-plane messages and services (`proto/ktfs.proto`).
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("ktfs.v1");
}

pub mod agent;
pub mod blockfiles;
pub mod broadcast;
pub mod cache;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod dataplane;
pub mod db;
pub mod fanout;
pub mod filewrite;
pub mod fs;
pub mod get;
pub mod hash;
pub mod hosted;
pub mod inflight;
pub mod k8s;
pub mod keeper;
pub mod key;
pub mod manifest;
pub mod meta;
pub mod mount;
pub mod net;
pub mod put;
pub mod scan;
pub mod server;
pub mod transfer;
