//! A getter's side of a broadcast window: [`membership`] (join, the sources the window gives,
//! report a failed one, leave), the swarm task that fetches each piece from whom the server's
//! board says (`swarm_fetch.rs`, started and fed by the membership), and [`offer`], which hands
//! each block verified here to this node's agent so that peers can fetch it before the file is
//! whole.

pub mod membership;
pub mod offer;
mod rejoin;
mod swarm_fetch;
