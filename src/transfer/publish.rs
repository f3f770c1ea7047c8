//! Publishing: the one path from a manifest and its blocks to a key, for `kt put`, for a file
//! closed in the mount, and for the agent's in-place publications alike.
//!
//! The blocks go first, then the manifest: the store refuses a `locale=store` manifest whose
//! blocks it lacks, and swaps the key to the new version in one step, so a publish that fails
//! midway leaves the old version in place.

use indicatif::ProgressBar;

use super::TransferError;
use crate::dataplane::upload::{self, UploadJob};
use crate::hash::Version;
use crate::proto::{InlineBlock, PublishRequest};
use crate::rpc::{ClientError, Fault, Store};

/// Where a publication's blocks are, and how they reach the store.
pub enum Payload {
    /// In files, uploaded on the data plane after asking the store which it lacks (a put of
    /// what the store holds sends nothing).
    Upload(Vec<UploadJob>),
    /// Inside the publish request: a small file already read whole, one round trip.
    Inline(Vec<InlineBlock>),
    /// Nothing to send: the blocks stay where they are (`locale=local`; the publishing node
    /// has registered its files as their sources), or the manifest has none (a directory, a
    /// symlink).
    InPlace,
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Transfer(#[from] TransferError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("the store server returned a malformed version")]
    BadVersion,
}

impl PublishError {
    pub fn fault(&self) -> Fault {
        match self {
            PublishError::Transfer(t) => t.fault(),
            PublishError::Client(c) => c.fault(),
            PublishError::BadVersion => Fault::Internal,
        }
    }
}

/// What a publish did.
#[derive(Debug, Clone)]
pub struct Published {
    pub version: Version,
    /// Payload bytes that crossed the network.
    pub bytes_sent: u64,
    /// The directory that holds the key, as the server shows it after the publish.
    pub parent: Option<crate::proto::ListEntry>,
    /// The key's own entry, as the server shows it after the publish.
    pub entry: Option<crate::proto::ListEntry>,
}

/// Sends `payload`, then publishes `req` (whose `inline_blocks` the payload fills).
pub async fn publish(
    store: &Store,
    server: &str,
    mut req: PublishRequest,
    payload: Payload,
    progress: &ProgressBar,
) -> Result<Published, PublishError> {
    let bytes_sent = match payload {
        Payload::Upload(jobs) => {
            upload::upload_missing_for(store, server, &req, jobs, progress).await?
        }
        Payload::Inline(blocks) => {
            req.inline_blocks = blocks;
            req.inline_blocks.iter().map(|b| b.data.len() as u64).sum()
        }
        Payload::InPlace => 0,
    };
    let resp = store.publish(req).await?;
    Ok(Published {
        version: Version::from_slice(&resp.version).ok_or(PublishError::BadVersion)?,
        bytes_sent,
        parent: resp.parent,
        entry: resp.entry,
    })
}
