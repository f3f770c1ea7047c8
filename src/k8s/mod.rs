//! Kubernetes: the defaults a pod's environment gives ([`env`]) and the Kubernetes API
//! ([`api`]: a node's zone, a port-forward to the store server from outside the cluster;
//! [`tokens`]: ServiceAccount tokens reviewed and requested; [`outside`]: how a client outside
//! the cluster reaches the store server).

pub mod api;
pub mod env;
pub mod outside;
pub mod tokens;
