//! Broadcast windows and fan-out trees, kept in memory by the store server.
//!
//! A window gathers the participants of one distribution under a `group_id`. Its quorum closes
//! when ANY of its criteria is met: `world_size` participants joined, every address of `ips`
//! joined, or `timeout` passed since it opened. Putters may wait for the quorum; getters of files
//! do not: each is given a parent the moment it joins (rolling), among the nodes that already
//! hold the version (seeds: the store, the origin, earlier getters) and the participants that are
//! receiving it, at most `fanout` children each. Nearer is better (same node, then same zone),
//! then shallower, then less loaded. A child whose parent fails asks again and gets a parent
//! outside its own subtree, so that no one ever waits on its own descendants.
//!
//! Getters without window settings join an implicit window per version with no quorum: that is
//! how concurrent getters spread over the sources instead of all hitting the store.
//!
//! Everything here is plain state driven with an explicit `now` (a [`Moment`] of the server's
//! clock), so tests run it without a clock:
//!
//! - [`Broadcasts`] (`broadcasts.rs`): every file window, and the requests that change them;
//! - `members.rs`: one window's members and its quorum; `parents.rs`: the choice of parents;
//! - `version_swarm.rs`: the swarm of one version (a board of [`crate::broadcast::swarm`]);
//!   `window_swarms.rs`: joins, syncs and mail of those swarms;
//! - [`GpuWindows`] (`gpu_windows.rs`, one window in `gpu_window.rs`): the windows of GPU keys
//!   (one coordinated transfer), and [`comms`] the NCCL communicators they run on;
//!   `gpu_adopt.rs`: a window taken up from its members after the replica that owned it died;
//! - what both kinds share: `quorum.rs` (when a quorum closes, when a window is forgotten),
//!   `nodes.rs` (seeds, live nodes, joiners) and `error.rs`.
//!
//! Getters of files fetch through the swarm when the server gives them the version's pieces at
//! their join; the parent it gives too is what a getter that does not speak the swarm uses.
//!
//! [`Moment`]: crate::clock::Moment

mod broadcasts;
pub mod comms;
mod error;
mod generations;
mod gpu_adopt;
mod gpu_window;
mod gpu_windows;
mod members;
mod nodes;
mod parents;
mod quorum;
mod version_swarm;
mod window_swarms;

pub use crate::rpc::{DEFAULT_FANOUT, STORE};
pub use broadcasts::{Broadcasts, Joined};
pub use error::BroadcastError;
pub use gpu_adopt::place_in;
pub use gpu_window::GpuJoiner;
pub use gpu_windows::{GpuView, GpuWindows};
pub use nodes::{Joiner, NodeView, Seed};
pub use quorum::WINDOW_IDLE;
pub use version_swarm::{Pieces as SwarmPieces, MIN_SWARM_PIECES};

#[cfg(test)]
mod tests;
