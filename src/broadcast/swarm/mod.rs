//! The swarm inside a broadcast window, as plain state machines: no sockets, no clock of their
//! own, no threads. The store server keeps a [`Board`] per window and version; each member keeps
//! a [`Schedule`]. The real server and getters drive them over gRPC and the data plane; the
//! [`sim`] drives the same code against simulated links and nodes.
//!
//! A version's **pieces** are its unique blocks, numbered in manifest order, so that the server
//! and every member name them alike without sending hashes; a version of few blocks has each
//! cut into smaller pieces ([`Plan`]), each checked on its own against its block's hash.
//!
//! The server schedules the swarm ([`crate::proto::SwarmSyncRequest`]). A member reports the
//! pieces it verified, the fetches that failed, and its free download slots; the board chooses
//! each fetch (a piece and its source) and counts every member's uploads, so a source is asked
//! for at most [`DEFAULT_UPLOADS`] pieces at once and the rarest pieces spread first. A fetch
//! is chosen at two moments: when a member syncs with a slot free (the rarest piece among a
//! sample of sources with an upload free, same zone first), and when a source's upload ends or
//! it verifies a piece (the rarest piece it holds, to one of a sample of the members waiting).
//! A member waiting for fetches holds its sync open at the server until one is chosen for it,
//! so a free uplink is used within one round trip, and a member tells the board of fetches
//! about to end ([`Pace`]: their expected end, less two round trips), so that their sources'
//! next uploads are lined up behind them rather than chosen once the news has travelled. Only pieces that no member holds are fetched
//! from the store, [`SEED_SLOTS`] at a time: the store sends each piece about once, whatever the
//! number of members, and each at its full rate, so that members trade it early.
//!
//! A mount's reader is a member too ([`Board::join_reader`]): it needs nothing until it says
//! what it reads (`want` in its syncs), is given the lowest piece it wants first (it waits for
//! that one), may take [`READER_UPLOADS`] pieces at once from a source that sends to it alone,
//! and serves what it read like any member.
//!
//! Why the server chooses: the first design let members choose from their neighbours'
//! announcements, and members crowded the few holders of the newest pieces, which answered most
//! of them busy: downlinks were idle half the time (2.77x one transfer at 5,000 simulated
//! members with 64 pieces, against 1.40x now; bench/RESULTS.md). The server knows every member and every
//! upload, so no fetch waits on a busy source or on news that has not arrived. The cost is a
//! sync per fetch, a few dozen bytes each; the simulation counts them at up to 5,000 members.

mod board;
mod limits;
mod pace;
mod pieceset;
mod plan;
mod rng;
mod schedule;
pub mod sim;
mod why;

pub use board::{Board, BUSY_BACKOFF, GRANT_TTL, KEEPALIVE, SILENCE};
pub use limits::{DEFAULT_UPLOADS, OBJECT_SEED_SLOTS, READER_UPLOADS, SEED_SLOTS};
pub use pace::Pace;
pub use pieceset::PieceSet;
pub use plan::{Plan, TARGET_PIECES};
pub use rng::Rng;
pub use schedule::{Failure, From, Request, Schedule, ScheduleConfig};

#[cfg(test)]
mod tests;
