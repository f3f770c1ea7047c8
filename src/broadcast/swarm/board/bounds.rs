//! How far the board goes: how long a store grant, a busy source's backoff and a member's
//! silence last, and how many links a member keeps and members a choice looks at.

use std::time::Duration;

/// A store fetch not followed by the piece's verification within this long is given again:
/// its member stalled, and the piece must not wait on it.
pub const GRANT_TTL: Duration = Duration::from_secs(30);
/// A source that answered busy (it serves other swarms or readers too) is not chosen again for
/// this long.
pub const BUSY_BACKOFF: Duration = Duration::from_millis(200);
/// A member that still fetches and has not synced for this long is taken for dead (its process
/// was killed): it leaves, and the uploads to it end. Members sync at least every
/// [`KEEPALIVE`] while they fetch.
pub const SILENCE: Duration = Duration::from_secs(10);
/// How often a member that fetches syncs at least, with nothing else to say.
pub const KEEPALIVE: Duration = Duration::from_secs(3);
/// Members (or waiting members) looked at for one choice beyond a member's links, when none
/// of its links can help: enough to find a rare piece, few enough that a choice costs the same
/// at 5,000 members as at 50.
pub(super) const SAMPLE: usize = 24;
/// Links a member gets at its join (both ways, same zone first). A member fetches from and
/// sends to its links, so each node keeps a bounded set of connections (a new connection per
/// block pays TCP's slow start, and every pair of nodes a full mesh: measured, 32 nodes on
/// 400 Mbit links took 8x one transfer with sources chosen from the whole swarm); a member
/// whose links hold nothing it needs, or a source none of whose links need what it holds, is
/// linked to one more.
pub const LINKS: usize = 8;
/// A member accepts links from joiners, and takes links to free sources when its own are busy,
/// until it has this many that still fetch.
pub(super) const MAX_LINKS: usize = 2 * LINKS;
