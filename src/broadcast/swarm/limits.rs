//! How much of the swarm moves at once: the store's seed slots (a reader's among them) and each
//! member's uploads.

/// Pieces fetched from the store at once, over the whole swarm. One, so that it arrives at the
/// store's full rate and members trade it while the store sends the next: a store that sent
/// every piece at once would finish none before it had sent them all.
pub const SEED_SLOTS: usize = 1;

/// [`SEED_SLOTS`] of a store whose blocks are in an object store: each piece it sends is a GET
/// there first (tens of milliseconds before the first byte), so one at a time sent at a
/// fraction of what the object store gives (measured: three getters of 512 MiB on etcd and
/// s3s-fs took 10.5 s with one, the store sending 51 MB/s, where fetching from the store
/// directly took 4.9 to 10.4 s).
pub const OBJECT_SEED_SLOTS: usize = 4;

/// Downloaders a member sends to at once. A piece is forwarded only once it is whole and
/// verified, so a sender that splits its uplink delays every piece it sends: with one upload
/// each, a piece's holders double once per piece time (the simulation, before members had
/// links: 1.33x one transfer at 5,000 members with 64 pieces, against 1.38x with two, and 1.77x
/// against 2.35x with 16).
pub const DEFAULT_UPLOADS: u32 = 1;

/// Uploads a source sends at once to a reader (a mount's) that it alone sends to, so that its
/// uplink stays busy across the round trips between them (measured, 512 MiB from one holder
/// to a fresh mount over loopback: 0.60 s as the parent's plain fetch did, 0.76 s with two at
/// once, 1.17 s with one). No more than a node serves at once (`UPLOAD_SLOTS`): a node answers
/// busy beyond, and the board backs off from it (asked for four with two slots: 11.5 s).
pub const READER_UPLOADS: u32 = 4;

/// Store fetches at once while the members waiting on the store read (mounts' readers): a
/// reader waits for the very block it asked for, and readers of different parts of a file
/// want different blocks, so the store keeps a reader's readahead going as a plain fetch
/// would, rather than one block per round trip.
pub const READER_SEED_SLOTS: usize = 4;
