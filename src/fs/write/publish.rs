//! What a staged file's publish sends, prepared under its publish lock, and what the answer
//! settles.

use crate::fs::error::{FsError, FsResult};
use crate::manifest::BlockRef;
use crate::proto::{InlineBlock, Locale, PublishRequest};
use crate::transfer::publish::Payload;

/// A staged file's publish, prepared under its publish lock: what to send, and what the
/// answer settles.
pub(crate) struct Prepared {
    pub(crate) settle: Settle,
    pub(crate) req: PublishRequest,
    pub(crate) payload: Payload,
}

/// What a publish's answer settles: the path, the count of changes the publish took in, and
/// the watcher it named.
pub(crate) struct Settle {
    pub(crate) path: String,
    pub(crate) changes: u64,
    pub(crate) watcher: u64,
}

impl Prepared {
    /// The request with its blocks inside, where it can go in a `PublishBatch` (a small file
    /// for the store, sent inline); `Err(self)` otherwise.
    pub(crate) fn into_batch_item(self) -> Result<(PublishRequest, Settle), Box<Prepared>> {
        match self.payload {
            Payload::Inline(blocks) if self.req.locale() == Locale::Store => {
                let mut req = self.req;
                req.inline_blocks = blocks;
                Ok((req, self.settle))
            }
            payload => Err(Box::new(Prepared { payload, ..self })),
        }
    }
}

/// The bytes of `blocks`, which lie one after another at the start of `buf`.
pub(crate) fn inline_blocks(blocks: &[BlockRef], buf: &[u8]) -> FsResult<Vec<InlineBlock>> {
    let mut at = 0usize;
    blocks
        .iter()
        .map(|b| {
            let end = at + b.len as usize;
            let data = buf
                .get(at..end)
                .ok_or_else(|| FsError::Invalid("a block lies past what was hashed".into()))?;
            at = end;
            Ok(InlineBlock {
                hash: b.hash.clone(),
                data: data.to_vec(),
            })
        })
        .collect()
}
