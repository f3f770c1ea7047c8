//! The reading side of the core: a file opened for reading ([`file`]), the blocks it reads,
//! from this node or fetched ([`loader`]), versions resolved ahead of a reader (`ahead`), and
//! the owner of them all ([`reader`]).

mod ahead;
pub mod file;
pub mod loader;
pub mod reader;
