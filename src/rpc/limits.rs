//! The numbers both ends of the control plane must agree on.

/// The store server's port, for both planes.
pub const DEFAULT_PORT: u16 = 7447;
/// Largest control-plane message (a manifest of a tree with very many files).
pub const MAX_RPC_MESSAGE: usize = 256 << 20;
/// Most bytes of blocks one publish may carry inline.
pub const MAX_INLINE_BYTES: usize = 1 << 20;
/// Largest file whose blocks travel inside its publish or its resolve: for a small file,
/// asking which blocks are missing and moving them on the data plane costs two more round trips
/// than the bytes themselves.
pub const MAX_INLINE_FILE: u32 = 64 << 10;
/// Hashes asked about in one `MissingBlocks` call.
pub const MISSING_BATCH: usize = 16_384;

/// Children a member of a broadcast window serves when the window does not say.
pub const DEFAULT_FANOUT: u32 = 50;
/// The label of the store server as a source or a parent.
pub const STORE: &str = "store";
