//! The jobs every caller shares, on top of the data plane ([`crate::dataplane`]) and broadcast
//! membership ([`crate::broadcast::member`]): [`put`] (scanning local files into a manifest,
//! cut into blocks, with the put index that spares unchanged files), [`get`] (planning where
//! each file's blocks come from, reusing what a local copy holds), [`read`] (a key's bytes in
//! memory, for ranges and small files) and [`publish`] (the one path by which a manifest and
//! its missing blocks reach the store).
//!
//! Everything here is client-side: it compiles without RocksDB or FUSE, as a laptop's `kt` and
//! the Python package link it.

pub mod get;
pub mod publish;
pub mod put;
pub mod read;
pub mod remotes;

pub use crate::dataplane::TransferError;
pub use remotes::Remotes;

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar on stderr for a transfer someone watches (`verbose` and a terminal), else one
/// that draws nothing.
pub fn progress_bar(verbose: bool) -> ProgressBar {
    if !verbose || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(0);
    pb.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}
