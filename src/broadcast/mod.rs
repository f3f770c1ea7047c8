//! Broadcast: one version to many getters at once, each getter becoming a source for the next.
//!
//! - [`swarm`]: the swarm's plain state machines (the server's board of who holds which piece,
//!   a member's schedule, the plan of a version's pieces, pacing) and their simulation;
//! - [`member`]: what a getter runs (`kt get`, a mount's reader): its membership of a window,
//!   its swarm task, and the pipelining of what it receives to its peers;
//! - [`windows`]: what the store server keeps: windows and their quorum, the choice of
//!   parents, each version's swarm board, and the windows of GPU keys.

pub mod member;
pub mod swarm;
#[cfg(feature = "daemons")]
pub mod windows;
