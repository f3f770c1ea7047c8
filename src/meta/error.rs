//! Why a metadata call failed: one error for every change and read of [`super::MetaStore`],
//! which the server maps to a gRPC status.

use super::backend::BackendError;
use crate::blocks::BlockError;
use crate::manifest::ManifestError;

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("key {0} not found")]
    NotFound(String),
    #[error("key {0} already exists (use --force to replace it)")]
    Exists(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotEmpty(String),
    #[error("{0}")]
    NotDir(String),
    #[error("{0}")]
    IsDir(String),
    #[error("{0} blocks of the manifest are not in the store")]
    MissingBlocks(usize),
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("block store: {0}")]
    Blocks(#[from] BlockError),
    #[error("stored record is corrupt: {0}")]
    Corrupt(String),
}
