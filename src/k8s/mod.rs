//! Kubernetes: the defaults a pod's environment gives ([`env`]) and the Kubernetes API
//! ([`api`]: a node's zone, a port-forward to the store server from outside the cluster).

pub mod api;
pub mod env;
