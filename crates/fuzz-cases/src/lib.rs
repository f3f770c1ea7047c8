//! The bodies of the fuzz targets in `fuzz/` (one `fuzz_target!` each), kept in a crate of the
//! workspace so that `cargo test` replays every input the fuzzer ever found to fail
//! (`fuzz/regressions/<target>/`) through exactly the code the fuzzer ran, without libFuzzer.
//!
//! Each body takes any bytes. A value or an error from ktfs is fine; a panic, a hang, or an
//! accepted input that breaks an invariant the rest of ktfs relies on is a finding, and the
//! bodies panic on purpose then (libFuzzer reports a panic as a crash).

mod data_plane;
mod gpu;
mod gpu_host;
mod grpc;
mod keys;
mod manifest;
mod rt;
pub mod seeds;

pub use data_plane::{data_plane_client, data_plane_server};
pub use gpu::gpu_ioctl;
pub use gpu_host::gpu_host_transport;
pub use grpc::{grpc_handlers, remove_grpc_store};
pub use keys::keys;
pub use manifest::manifest;

/// A target's body: any bytes in, a panic on a finding.
pub type Body = fn(&[u8]);

/// Every target by the name of its `fuzz/fuzz_targets/<name>.rs`, its corpus and its
/// regressions folder.
pub const TARGETS: &[(&str, Body)] = &[
    ("data_plane_server", data_plane_server),
    ("data_plane_client", data_plane_client),
    ("manifest", manifest),
    ("gpu_ioctl", gpu_ioctl),
    ("gpu_host_transport", gpu_host_transport),
    ("keys", keys),
    ("grpc_handlers", grpc_handlers),
];
