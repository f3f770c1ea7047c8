//! The server's schedule of one swarm: who holds which pieces, who sends to whom, and which
//! fetch each member starts next.
//!
//! Every fetch is the board's choice, so it knows each node's uploads in flight exactly: a
//! source is asked for no more pieces at once than the board's `uploads`, and never answers
//! busy for this swarm. Two moments start fetches: a member's sync (it has download slots free:
//! the rarest piece among its links with an upload slot free), and a source's slot coming free
//! or the source verifying a piece (the rarest piece it holds, to one of its links that waits).
//! Fetches made for a member between its syncs wait in its mailbox; [`Board::woken`] names the
//! members that have mail, so that the server can answer their waiting syncs at once.
//!
//! The board's state and who is on it are in `roster.rs`, what a sync reports in `reports.rs`,
//! the choice of each fetch in `choice.rs`.

mod bounds;
mod choice;
mod pool;
mod reports;
mod roster;

#[cfg(test)]
pub use bounds::LINKS;
pub use bounds::{BUSY_BACKOFF, GRANT_TTL, KEEPALIVE, SILENCE};
pub use roster::Board;
