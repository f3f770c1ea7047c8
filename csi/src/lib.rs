//! kt-csi: the ktfs CSI driver. A PVC of the ktfs StorageClass is a key prefix in a ktfs
//! namespace; publishing it on a node bind-mounts that prefix, seen through the node agent's
//! shared mount of the namespace, into the pod.
//!
//! The gRPC handlers ([`identity`], [`controller`], [`node`]) only check requests and map
//! errors, one call at a time per volume ([`guard`]); volumes are [`volume`], the mount table
//! and mount calls [`mounts`], the node agent and its namespace mounts [`agents`], node
//! publishing [`publish`], and the `kt` calls and their exit codes [`kt`].

pub mod agents;
pub mod capability;
pub mod client;
pub mod controller;
pub mod guard;
pub mod identity;
pub mod kt;
pub mod mounts;
pub mod node;
pub mod publish;
pub mod server;
pub mod volume;

/// The CSI spec's messages and services (`csi.v1`), generated from `proto/csi.proto`.
#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod proto {
    tonic::include_proto!("csi.v1");
}

/// The driver name the CSIDriver object and the StorageClass use.
pub const DRIVER_NAME: &str = "kt.ktfs.io";
/// The topology key NodeGetInfo reports, with the node id as its value.
pub const TOPOLOGY_NODE_KEY: &str = "topology.kt.ktfs.io/node";
