//! What the host tells every ktfs binary alike, in a crate of its own so that `kt-csi` and
//! `mount.kt` share it without linking the `ktfs` library: the fields of its mount table
//! ([`mountinfo`]) and the signals that stop a daemon ([`shutdown_signal`]).

pub mod mountinfo;

#[cfg(feature = "signal")]
mod signal;
#[cfg(feature = "signal")]
pub use signal::shutdown_signal;
