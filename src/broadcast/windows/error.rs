//! What a window request can fail with, file windows and GPU windows alike.

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BroadcastError {
    #[error("no broadcast window {0}")]
    NoWindow(String),
    #[error("window {0} has no member {1}")]
    NoMember(String, u64),
    #[error("bad window request: {0}")]
    Bad(String),
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    Exists(String),
}
