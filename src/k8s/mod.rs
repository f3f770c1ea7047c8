//! Kubernetes: the defaults a pod's environment gives ([`env`]) and the Kubernetes API
//! ([`api`]: a node's zone, a port-forward to the store server from outside the cluster;
//! [`tokens`]: ServiceAccount tokens reviewed and requested).

pub mod api;
pub mod env;
pub mod tokens;
