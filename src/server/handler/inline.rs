//! Inline blocks: those a publish carries (checked against their hashes, and against the
//! lengths the manifest gives them, before any is stored), and those a resolve sends of a
//! small file.

use tonic::Status;

use crate::blocks::store::StoreBlocks;
use crate::blocks::Served;
use crate::hash::BlockHash;
use crate::key::{KeyPath, Namespace};
use crate::meta::{MetaError, MetaStore};
use crate::proto::{EntryKind, InlineBlock, Manifest};
use crate::rpc::{MAX_INLINE_BYTES, MAX_INLINE_FILE};
use crate::server::status::invalid;

/// Inline blocks of a publish, each checked against its hash.
pub(super) fn checked_inline(
    blocks: Vec<InlineBlock>,
) -> Result<Vec<(BlockHash, Vec<u8>)>, Status> {
    let total: usize = blocks.iter().map(|b| b.data.len()).sum();
    if total > MAX_INLINE_BYTES {
        return Err(invalid(format!(
            "{total} bytes of inline blocks exceed the limit of {MAX_INLINE_BYTES}; upload them on the data plane"
        )));
    }
    blocks
        .into_iter()
        .map(|b| {
            let hash =
                BlockHash::from_slice(&b.hash).ok_or_else(|| invalid("inline block: bad hash"))?;
            if BlockHash::of(&b.data) != hash {
                return Err(invalid(format!(
                    "inline block {} does not match its hash",
                    hash.hex()
                )));
            }
            Ok((hash, b.data))
        })
        .collect()
}

/// Stores the inline blocks of a publish in `ns`, which references them from now on: sent
/// inline, they were uploaded by the caller as a data-plane upload is.
pub(super) fn store_inline(
    meta: &MetaStore,
    ns: &Namespace,
    inline: &[(BlockHash, Vec<u8>)],
) -> Result<(), MetaError> {
    let scopes: Vec<_> = meta.scope_of(ns).into_iter().collect();
    for (hash, data) in inline {
        meta.blocks().put_for(&scopes, hash, data)?;
    }
    Ok(())
}

/// Every place `m` names an inline block gives it the block's length: checked before the
/// blocks are stored, so a refused publish leaves nothing behind.
pub(super) fn check_inline_lengths(
    key: &KeyPath,
    m: &Manifest,
    inline: &[(BlockHash, Vec<u8>)],
) -> Result<(), Status> {
    if inline.is_empty() {
        return Ok(());
    }
    let lens: std::collections::HashMap<&[u8], usize> = inline
        .iter()
        .map(|(h, data)| (&h.0[..], data.len()))
        .collect();
    for e in &m.entries {
        for (i, b) in e.blocks.iter().enumerate() {
            let Some(&len) = lens.get(&b.hash[..]) else {
                continue;
            };
            if len != b.len as usize {
                let file = if e.path.is_empty() {
                    key.to_string()
                } else {
                    format!("{key}/{}", e.path)
                };
                return Err(invalid(format!(
                    "{file}: block {i} ({}) is {len} bytes inline, the manifest says {}",
                    BlockHash::from_slice(&b.hash)
                        .map(|h| h.hex())
                        .unwrap_or_default(),
                    b.len
                )));
            }
        }
    }
    Ok(())
}

/// The blocks of a small one-file manifest, if the caller wants them and they are all small
/// blocks in the database (never a block file: those go on the data plane).
pub(super) fn inline_file(
    blocks: &StoreBlocks,
    m: &Manifest,
    up_to: u32,
) -> Result<Vec<InlineBlock>, MetaError> {
    let [entry] = &m.entries[..] else {
        return Ok(Vec::new());
    };
    if entry.kind() != EntryKind::File || entry.size > u64::from(up_to.min(MAX_INLINE_FILE)) {
        return Ok(Vec::new());
    }
    let mut out = Vec::with_capacity(entry.blocks.len());
    for b in &entry.blocks {
        let Some(hash) = crate::manifest::block_hash(b) else {
            return Ok(Vec::new());
        };
        match blocks.get(&hash)? {
            Some(Served::Bytes(data)) => out.push(InlineBlock {
                hash: b.hash.clone(),
                data: data.to_vec(),
            }),
            _ => return Ok(Vec::new()),
        }
    }
    Ok(out)
}
