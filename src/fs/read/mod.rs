//! The reading side of the core: a file opened for reading ([`file`]), the blocks it reads,
//! from this node or fetched ([`loader`]), and the owner of both ([`reader`]).

pub mod file;
pub mod loader;
pub mod reader;
