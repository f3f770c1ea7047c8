//! The kernel's operations on the core, each a method of [`FsCore`](super::core::FsCore) that
//! uses the owners it needs: names ([`lookup`]), directories ([`dir`]), changes to the
//! namespace ([`namespace`]), files ([`file`]), publishing what was written ([`publish`],
//! [`writeback`]), the one extended attribute ([`xattr`]) and the GPU control tree ([`gpu`]).

pub mod dir;
pub mod file;
pub mod gpu;
pub mod lookup;
pub mod namespace;
pub mod publish;
pub mod writeback;
pub mod xattr;
