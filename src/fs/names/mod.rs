//! The namespace as this mount sees it: the kernel's inode numbers and the paths they name
//! ([`inode`]), and what the store server listed, cached under the watch's lease
//! ([`listings`]).

mod bound;
pub mod inode;
mod last_seen;
pub mod listings;
