//! Why a member's fetch gave nothing: the codes of a sync's failures, which a member's
//! [`Schedule`](super::Schedule) sends and the [`Board`](super::Board) reads.

/// Why a member's fetch gave nothing, as the sync reports it.
pub const WHY_BUSY: u32 = 1;
pub const WHY_MISSING: u32 = 2;
pub const WHY_BROKEN: u32 = 3;
pub const WHY_DECLINED: u32 = 4;
