use std::time::{Duration, Instant};

use super::sim::{self, SimConfig};
use super::why::{WHY_BROKEN, WHY_BUSY, WHY_DECLINED, WHY_MISSING};
use super::*;
use crate::proto::{SwarmFailure, SwarmFetch, SwarmSyncReply, SwarmSyncRequest};

fn sync(m: u64, verified: &[u32], idle: u32) -> SwarmSyncRequest {
    SwarmSyncRequest {
        member: m,
        verified: verified.to_vec(),
        idle,
        ..Default::default()
    }
}

fn failed(m: u64, piece: u32, from: Option<u64>, why: u32) -> SwarmSyncRequest {
    SwarmSyncRequest {
        member: m,
        failed: vec![SwarmFailure {
            piece,
            from: from.unwrap_or(0),
            store: from.is_none(),
            why,
        }],
        ..Default::default()
    }
}

/// A fetch as (piece, source member or None for the store).
type Fetch = (u32, Option<u64>);

fn fetches(r: &SwarmSyncReply) -> Vec<Fetch> {
    r.fetch
        .iter()
        .map(|f| (f.piece, (!f.store).then_some(f.from)))
        .collect()
}

const HOLDER: u64 = 1 << 32;

#[test]
fn piece_sets_count_and_refuse_indices_out_of_range() {
    let mut s = PieceSet::new(70);
    assert!(s.insert(0) && s.insert(69) && !s.insert(69));
    assert!(!s.insert(70), "an index past the end is refused");
    assert_eq!(s.count(), 2);
    assert!(s.remove(0) && !s.remove(0));
    assert_eq!(s.iter().collect::<Vec<_>>(), vec![69]);
    assert!(!s.contains(1000));
    let mut t = PieceSet::new(70);
    for i in [3, 64, 69] {
        t.insert(i);
    }
    s.insert(64);
    assert_eq!(s.iter_and(&t).collect::<Vec<_>>(), vec![64, 69]);
}

#[test]
fn the_store_sends_one_piece_at_a_time_and_each_piece_once() {
    let now = Instant::now();
    let mut b = Board::new(8, 1);
    for m in 0..4 {
        b.join(m, "", true);
    }
    let mut got: Vec<(u64, Vec<Fetch>)> = (0..4)
        .map(|m| (m, fetches(&b.sync(&sync(m, &[], 1), now))))
        .collect();
    let first: Vec<_> = got.iter().filter(|(_, f)| !f.is_empty()).collect();
    assert_eq!(first.len(), SEED_SLOTS, "{got:?}");
    let (m, f) = first[0].clone();
    assert_eq!(f[0].1, None, "from the store");
    assert_eq!(b.granted(), 1);
    // Its verification frees the store for a waiting member and makes it a source for another.
    b.woken();
    let r = b.sync(&sync(m, &[f[0].0], 1), now);
    let woken = b.woken();
    assert_eq!(
        woken.len(),
        2,
        "one from the store, one from {m}: {woken:?}"
    );
    for w in woken {
        got.push((w, fetches(&b.take_mail(w))));
    }
    got.push((m, fetches(&r)));
    let mut from_store: Vec<u32> = got
        .iter()
        .flat_map(|(_, f)| f.iter().filter(|x| x.1.is_none()).map(|x| x.0))
        .collect();
    from_store.sort();
    from_store.dedup();
    assert_eq!(from_store.len(), 2, "two pieces, each once: {got:?}");
    assert_eq!(b.granted(), 2);
    let from_m: Vec<_> = got
        .iter()
        .flat_map(|(_, f)| f.iter().filter(|x| x.1 == Some(m)))
        .collect();
    assert_eq!(from_m, vec![&(f[0].0, Some(m))]);
}

#[test]
fn a_source_sends_one_piece_at_a_time_and_the_rarest_first() {
    let now = Instant::now();
    let mut b = Board::new(4, 2);
    b.join_holder(HOLDER, "");
    b.join(0, "", true);
    b.join(1, "", true);
    // Member 0 gets piece p from the holder; member 1 waits: the holder sends one at a time.
    let f0 = fetches(&b.sync(&sync(0, &[], 1), now));
    assert_eq!(f0.len(), 1);
    assert_eq!(f0[0].1, Some(HOLDER), "a holder before the store");
    assert!(fetches(&b.sync(&sync(1, &[], 1), now)).is_empty());
    assert_eq!(
        b.granted(),
        0,
        "the holder has everything: nothing from the store"
    );
    // When 0 has p, the holder's upload ends: 1 gets a piece, the rarest: p has two holders now,
    // so from the holder one of the others, or p from member 0.
    let p = f0[0].0;
    b.woken();
    let again = fetches(&b.sync(&sync(0, &[p], 1), now));
    let mail = fetches(&b.take_mail(1));
    assert_eq!(mail.len(), 1, "{mail:?} {again:?}");
    let all: Vec<_> = again.iter().chain(&mail).collect();
    assert!(
        all.iter()
            .all(|&&(q, from)| q != p || from == Some(0) || from == Some(HOLDER)),
        "{all:?}"
    );
    assert!(
        all.iter().filter(|x| x.1 == Some(HOLDER)).count() <= 1,
        "{all:?}"
    );
    assert!(
        all.iter().filter(|x| x.1 == Some(0)).count() <= 1,
        "{all:?}"
    );
}

#[test]
fn rarer_pieces_are_sent_before_common_ones() {
    let now = Instant::now();
    let mut b = Board::new(3, 3);
    for m in 0..4 {
        b.join(m, "", true);
    }
    // 0 holds {0, 1, 2}; 1 and 2 hold 0 and 1: piece 2 is the rarest.
    for (m, have) in [(0, vec![0, 1, 2]), (1, vec![0, 1]), (2, vec![0, 1])] {
        b.sync(
            &SwarmSyncRequest {
                skip: vec![],
                ..sync(m, &have, 0)
            },
            now,
        );
    }
    let f = fetches(&b.sync(&sync(3, &[], 1), now));
    assert_eq!(f, vec![(2, Some(0))]);
}

#[test]
fn failed_fetches_free_their_source_and_say_what_the_board_believes() {
    let now = Instant::now();
    let mut b = Board::new(4, 4);
    b.join(0, "", true);
    b.join(1, "", true);
    b.sync(&sync(0, &[0, 1, 2, 3], 0), now);
    let f = fetches(&b.sync(&sync(1, &[], 1), now));
    assert_eq!(f[0].1, Some(0));
    // Busy: not asked again until the backoff ends.
    assert!(fetches(&b.sync(&failed(1, f[0].0, Some(0), WHY_BUSY), now)).is_empty());
    let r = b.sync(&sync(1, &[], 1), now + BUSY_BACKOFF);
    let f = fetches(&r);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].1, Some(0));
    // Missing: the source holds it no more.
    let p = f[0].0;
    b.sync(&failed(1, p, Some(0), WHY_MISSING), now + BUSY_BACKOFF);
    assert_eq!(b.holders(p), 0);
    // Broken: never that source again for this member.
    let f = fetches(&b.sync(&sync(1, &[], 1), now + BUSY_BACKOFF));
    assert_eq!(f[0].1, Some(0));
    b.sync(&failed(1, f[0].0, Some(0), WHY_BROKEN), now + BUSY_BACKOFF);
    let f = fetches(&b.sync(&sync(1, &[], 1), now + BUSY_BACKOFF));
    assert!(
        f.iter().all(|x| x.1 != Some(0)),
        "a broken source is not chosen again: {f:?}"
    );
    // Failures the board did not start change nothing.
    let before = b.holders(1);
    b.sync(&failed(1, 1, Some(77), WHY_MISSING), now);
    b.sync(&failed(1, 2, Some(0), WHY_MISSING), now);
    assert_eq!(b.holders(1), before);
}

#[test]
fn a_declined_fetch_is_not_chosen_again_for_that_member() {
    let now = Instant::now();
    let mut b = Board::new(4, 9);
    b.join(0, "", true);
    b.join(1, "", true);
    b.sync(&sync(0, &[0, 1, 2, 3], 0), now);
    let f = fetches(&b.sync(&sync(1, &[], 1), now));
    let r = b.sync(
        &SwarmSyncRequest {
            idle: 1,
            ..failed(1, f[0].0, Some(0), WHY_DECLINED)
        },
        now,
    );
    let again = fetches(&r);
    assert_eq!(again.len(), 1, "the slot is free again");
    assert_ne!(again[0].0, f[0].0);
}

#[test]
fn a_member_that_dies_counts_no_more_and_its_store_fetch_goes_to_another() {
    let now = Instant::now();
    let mut b = Board::new(2, 3);
    b.join(0, "", true);
    b.join(1, "", true);
    let f = fetches(&b.sync(&sync(0, &[], 1), now));
    assert_eq!(f.len(), 1);
    assert!(fetches(&b.sync(&sync(1, &[], 1), now)).is_empty());
    // 0 holds the other piece already: it sends it to 1, which waits.
    b.sync(&sync(0, &[1 - f[0].0], 0), now);
    assert_eq!(fetches(&b.take_mail(1)), vec![(1 - f[0].0, Some(0))]);
    b.leave(0, false);
    assert_eq!(b.holders(1 - f[0].0), 0);
    // 1's fetch from 0 breaks; what 0 fetched from the store goes to 1.
    let again = fetches(&b.sync(
        &SwarmSyncRequest {
            idle: 1,
            ..failed(1, 1 - f[0].0, Some(0), WHY_BROKEN)
        },
        now,
    ));
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].1, None, "from the store again");
    // A member that left with a copy on a node that serves stays a source.
    b.sync(&sync(1, &[0, 1], 0), now);
    b.leave(1, true);
    assert_eq!(b.holders(0), 1);
}

#[test]
fn a_stalled_store_fetch_is_given_again_after_its_time() {
    let now = Instant::now();
    let mut b = Board::new(1, 3);
    b.join(0, "", true);
    b.join(1, "", true);
    assert_eq!(fetches(&b.sync(&sync(0, &[], 1), now)), vec![(0, None)]);
    assert!(fetches(&b.sync(&sync(1, &[], 1), now)).is_empty());
    let later = now + GRANT_TTL + Duration::from_secs(1);
    assert_eq!(fetches(&b.sync(&sync(1, &[], 1), later)), vec![(0, None)]);
}

#[test]
fn bad_indices_and_unknown_members_are_ignored() {
    let now = Instant::now();
    let mut b = Board::new(4, 1);
    b.join(0, "", true);
    let r = b.sync(
        &SwarmSyncRequest {
            skip: vec![9, u32::MAX],
            ..sync(0, &[99, u32::MAX], 1)
        },
        now,
    );
    assert_eq!(b.holders(0) + b.holders(3), 0);
    assert!(fetches(&r).len() <= 1);
    assert!(b.sync(&sync(42, &[1], 4), now).fetch.is_empty());
    // A member's side ignores fetches of pieces out of range or held, and declines them.
    let mut s = Schedule::new(5, 2, ScheduleConfig::default());
    s.already(0);
    s.apply(&SwarmSyncReply {
        fetch: vec![
            SwarmFetch {
                piece: 0,
                from: 1,
                store: false,
            },
            SwarmFetch {
                piece: 7,
                from: 1,
                store: false,
            },
        ],
        ..Default::default()
    });
    assert!(s.start().is_empty());
    let req = s.sync_request();
    assert_eq!(req.verified, vec![0]);
    assert_eq!(req.failed.len(), 2);
    assert!(req.failed.iter().all(|f| f.why == WHY_DECLINED));
}

#[test]
fn a_member_reports_skipped_pieces_once_and_counts_its_free_slots() {
    let mut s = Schedule::new(1, 4, ScheduleConfig { max_inflight: 2 });
    s.skip(3);
    let first = s.sync_request();
    assert_eq!((first.skip.clone(), first.idle), (vec![3], 2));
    assert!(s.sync_request().skip.is_empty(), "once");
    s.apply(&SwarmSyncReply {
        fetch: vec![SwarmFetch {
            piece: 0,
            from: 0,
            store: true,
        }],
        ..Default::default()
    });
    assert_eq!(s.idle(), 1);
    let go = s.start();
    assert_eq!(
        go,
        vec![Request {
            piece: 0,
            from: From::Seed
        }]
    );
    s.failed(0, From::Seed, Failure::Busy);
    assert!(s.news());
    let req = s.sync_request();
    assert_eq!(req.failed[0].why, WHY_BUSY);
    assert!(req.failed[0].store);
    assert_eq!(req.idle, 2);
    // A sync that failed on the way is sent again, news and all.
    assert!(!s.news());
    s.unsent(req.clone());
    assert!(s.news());
    assert_eq!(s.sync_request().failed, req.failed);
}

#[test]
fn nodes_that_hold_the_version_serve_before_the_store_and_non_serving_members_serve_no_one() {
    let now = Instant::now();
    let mut b = Board::new(4, 6);
    b.join(0, "", false);
    b.join(1, "", true);
    // A member without an agent fetches from the store, but is never a source.
    let f = fetches(&b.sync(&sync(0, &[], 1), now));
    assert_eq!(f.len(), 1);
    b.sync(&sync(0, &[f[0].0], 1), now);
    assert_eq!(b.holders(f[0].0), 1);
    let g = fetches(&b.sync(&sync(1, &[], 1), now));
    assert!(g.iter().all(|x| x.1 != Some(0)), "{g:?}");
    // A holder joins: its pieces come from it, not from the store.
    let mut b = Board::new(4, 6);
    b.join_holder(HOLDER, "");
    b.join(2, "", true);
    let h = fetches(&b.sync(&sync(2, &[], 1), now));
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].1, Some(HOLDER));
    assert_eq!(b.granted(), 0);
}

#[test]
fn a_source_in_the_same_zone_comes_first() {
    let now = Instant::now();
    for seed in 0..8 {
        let mut b = Board::new(2, seed);
        b.join_holder(HOLDER, "far");
        b.join_holder(HOLDER + 1, "near");
        b.join(0, "near", true);
        b.join(1, "near", true);
        assert_eq!(
            fetches(&b.sync(&sync(0, &[], 1), now))[0].1,
            Some(HOLDER + 1)
        );
        // The near one sends to 0 already: 1 takes the far one rather than wait.
        assert_eq!(fetches(&b.sync(&sync(1, &[], 1), now))[0].1, Some(HOLDER));
    }
}

#[test]
fn a_member_fetches_from_its_links_while_they_have_what_it_needs() {
    let now = Instant::now();
    let mut b = Board::new(64, 11);
    for h in 0..40 {
        b.join_holder(HOLDER + h, "");
    }
    b.join(0, "", true);
    let mut sources = std::collections::BTreeSet::new();
    let mut verified = Vec::new();
    for _ in 0..64 {
        let f = fetches(&b.sync(&sync(0, &verified, 1), now));
        assert_eq!(f.len(), 1);
        sources.insert(f[0].1);
        verified = vec![f[0].0];
    }
    // 40 holders could serve it; a connection to each would be 40.
    assert!(
        sources.len() <= super::board::LINKS,
        "{} sources: {sources:?}",
        sources.len()
    );
}

fn small(nodes: usize, die: f64) -> SimConfig {
    SimConfig {
        nodes,
        pieces: 32,
        piece_bytes: 1 << 20,
        upload: 5e6,
        download: 5e6,
        store_upload: 5e6,
        join_spread: Duration::from_secs(2),
        die_fraction: die,
        fanout: DEFAULT_UPLOADS,
        sends: 4,
        pace: true,
        queue: 0,
        seed_slots: SEED_SLOTS,
        latency: Duration::from_millis(2),
        poll: Duration::from_secs(1),
        schedule: ScheduleConfig::default(),
        seed: 7,
    }
}

#[test]
fn a_simulated_swarm_finishes_near_one_transfer_with_the_store_sending_about_one_copy() {
    let r = sim::run(&small(60, 0.0));
    assert_eq!(r.unfinished, 0);
    assert_eq!(r.ratios.len(), 60);
    assert!(r.store_ratio() <= 1.1, "store sent {:.2}x", r.store_ratio());
    // A herd from the store takes 60 transfers for the last of 60 getters; the pieces' holders
    // double once per piece time: 1 + log2(60) / 32 = 1.18x at best.
    let worst = r.quantile(1.0);
    assert!(worst < 1.5, "slowest node took {worst:.2}x one transfer");
    assert_eq!(r.busy_refusals, 0, "no source is asked beyond its uploads");
    // Each node fetches from its links, not from the whole swarm (a connection per pair).
    assert!(
        r.sources_per_node <= 2.0 * super::board::LINKS as f64,
        "{:.1} sources per node",
        r.sources_per_node
    );
}

#[test]
fn a_simulated_swarm_survives_members_dying_mid_transfer() {
    let r = sim::run(&small(60, 0.1));
    assert!(r.died > 0);
    assert!(r.broken_fetches > 0, "some fetches were cut by the dying");
    assert_eq!(r.unfinished, 0, "every survivor finishes");
    assert!(r.store_ratio() <= 2.0, "store sent {:.2}x", r.store_ratio());
}

fn skip_all_but(m: u64, pieces: u32, wanted: &[u32], idle: u32) -> SwarmSyncRequest {
    SwarmSyncRequest {
        member: m,
        skip: (0..pieces).filter(|p| !wanted.contains(p)).collect(),
        idle,
        ..Default::default()
    }
}

#[test]
fn a_reader_is_given_only_what_it_wants_and_the_lowest_piece_first() {
    let now = Instant::now();
    let mut b = Board::new(16, 1);
    b.join_holder(HOLDER, "");
    b.join_reader(0, "");
    // It reads pieces 5, 9 and 12 (not the rarest first: all are as common), one at a time.
    let r = b.sync(&skip_all_but(0, 16, &[12, 9, 5], 1), now);
    assert_eq!(fetches(&r), vec![(5, Some(HOLDER))]);
    let r = b.sync(&sync(0, &[5], 1), now);
    assert_eq!(fetches(&r), vec![(9, Some(HOLDER))]);
    // It reads on: piece 2, wanted now, comes before 12, wanted earlier.
    let mut req = sync(0, &[9], 1);
    req.want = vec![2];
    let r = b.sync(&req, now);
    assert_eq!(fetches(&r), vec![(2, Some(HOLDER))]);
    let r = b.sync(&sync(0, &[2], 1), now);
    assert_eq!(fetches(&r), vec![(12, Some(HOLDER))]);
    // With all it wanted here, nothing more is chosen for it, and nothing came from the store.
    let r = b.sync(&sync(0, &[12], 1), now);
    assert!(r.fetch.is_empty(), "{r:?}");
    assert_eq!(b.granted(), 0);
    // What it read, it serves: a member that needs piece 9 is given it from the reader or
    // the holder, never the store.
    b.join(1, "", true);
    let r = b.sync(&skip_all_but(1, 16, &[9], 1), now);
    let f = fetches(&r);
    assert!(matches!(f[..], [(9, Some(0 | HOLDER))]), "{f:?}");
}

#[test]
fn a_reader_takes_several_pieces_at_once_from_a_source_no_one_else_waits_for() {
    let now = Instant::now();
    let mut b = Board::new(16, 1);
    b.join_holder(HOLDER, "");
    b.join_reader(0, "");
    // Its readahead streams from the one holder, as a plain fetch would.
    let r = b.sync(&sync(0, &[], 4), now);
    assert_eq!(
        fetches(&r),
        (0..READER_UPLOADS)
            .map(|p| (p, Some(HOLDER)))
            .collect::<Vec<_>>()
    );
    // A member that waits for the holder: the reader takes no more from it, and passes on
    // what it read.
    b.join(1, "", true);
    let r = b.sync(&sync(1, &[], 1), now);
    assert!(r.fetch.is_empty(), "{r:?}");
    let r = b.sync(&sync(0, &[0], 1), now);
    assert!(r.fetch.is_empty(), "{r:?}");
    assert_eq!(fetches(&b.take_mail(1)), vec![(0, Some(0))]);
    assert_eq!(b.granted(), 0);
}

#[test]
fn a_reader_takes_several_pieces_from_the_store_at_once_and_none_twice() {
    let now = Instant::now();
    let mut b = Board::new(16, 1);
    b.join_reader(0, "");
    b.join(1, "", true);
    let r = b.sync(&sync(0, &[], 4), now);
    // Its readahead at once, in order: it waits for the first.
    assert_eq!(
        fetches(&r),
        vec![(0, None), (1, None), (2, None), (3, None)],
        "{r:?}"
    );
    // A `kt get` member is given no store fetch beyond the store's one slot, and no piece the
    // reader fetches.
    let r = b.sync(&sync(1, &[], 1), now);
    assert!(r.fetch.is_empty(), "{r:?}");
    assert_eq!(b.granted(), 4);
    // Once the reader holds them, the member fetches them from it (and from the store only
    // what no one holds).
    let r = b.sync(&sync(0, &[0, 1, 2, 3], 0), now);
    assert!(r.fetch.is_empty(), "{r:?}");
    let f = fetches(&b.sync(&sync(1, &[], 2), now));
    assert!(f.iter().any(|&(p, s)| p <= 3 && s == Some(0)), "{f:?}");
    assert!(f.iter().all(|&(p, s)| s.is_some() || p > 3), "{f:?}");
}

#[test]
fn a_schedule_asks_for_skipped_pieces_when_they_are_wanted() {
    let mut s = Schedule::new(0, 8, ScheduleConfig::reader());
    for p in 0..8 {
        s.skip(p);
    }
    assert_eq!(s.idle(), 0, "nothing is needed");
    // Wanted before the first sync: simply not skipped.
    assert!(s.want(3));
    let req = s.sync_request();
    assert!(!req.skip.contains(&3) && req.skip.len() == 7 && req.want.is_empty());
    assert_eq!(req.idle, ScheduleConfig::reader().max_inflight);
    // Wanted after it: told as wanted.
    assert!(!s.news());
    assert!(s.want(5));
    assert!(s.news());
    let req = s.sync_request();
    assert_eq!(req.want, vec![5]);
    assert!(req.skip.is_empty());
    // A wanted piece fetched and verified is here: wanting it again asks for nothing.
    s.apply(&SwarmSyncReply {
        fetch: vec![SwarmFetch {
            piece: 5,
            from: 0,
            store: true,
        }],
        ..Default::default()
    });
    assert_eq!(s.start().len(), 1);
    s.verified(5);
    assert!(s.has(5) && !s.want(5));
    assert!(!s.complete());
}

#[test]
fn a_member_whose_only_holder_broke_for_it_is_sent_the_piece_by_the_store() {
    let now = Instant::now();
    let mut b = Board::new(4, 1);
    b.join_holder(HOLDER, "");
    b.join_reader(0, "");
    let r = b.sync(&skip_all_but(0, 4, &[1, 2], 1), now);
    assert_eq!(fetches(&r), vec![(1, Some(HOLDER))]);
    assert_eq!(b.granted(), 0, "a member holds it: not from the store");
    // The holder's node died (its lease has not run out yet): the piece comes from the store,
    // and so does the next, which only that holder has too.
    let mut req = failed(0, 1, Some(HOLDER), WHY_BROKEN);
    req.idle = 1;
    let r = b.sync(&req, now);
    assert_eq!(fetches(&r), vec![(1, None)]);
    let r = b.sync(&sync(0, &[1], 1), now);
    assert_eq!(fetches(&r), vec![(2, None)]);
}

#[test]
fn a_member_silent_while_it_fetches_is_taken_for_dead_and_its_source_serves_others() {
    let now = Instant::now();
    let mut b = Board::new(8, 1);
    b.join_holder(HOLDER, "");
    b.join(0, "", true);
    b.join(1, "", true);
    let r = b.sync(&sync(0, &[], 1), now);
    assert_eq!(fetches(&r)[0].1, Some(HOLDER));
    // Member 0's process is killed mid-fetch: the holder's one upload is its. Member 1 waits.
    let r = b.sync(&sync(1, &[], 1), now);
    assert!(r.fetch.is_empty(), "{r:?}");
    // A member that keeps syncing is not taken for dead, however long its fetch runs.
    let later = now + SILENCE - Duration::from_millis(1);
    let r = b.sync(&sync(1, &[], 1), later);
    assert!(r.fetch.is_empty(), "{r:?}");
    // (Members are looked at for silence once a second.)
    let dead = now + SILENCE + Duration::from_secs(1);
    let r = b.sync(&sync(1, &[], 1), dead);
    assert_eq!(fetches(&r).len(), 1, "{r:?}");
    assert_eq!(fetches(&r)[0].1, Some(HOLDER));
    // The dead member is out: a sync from it (a process that was only stalled) is given nothing.
    assert!(b.sync(&sync(0, &[], 1), dead).fetch.is_empty());
}

#[test]
fn a_fetch_told_ending_frees_its_source_for_the_next_one_at_a_time() {
    let now = Instant::now();
    let mut b = Board::new(4, 2);
    b.join_holder(HOLDER, "");
    for m in 0..3 {
        b.join(m, "", true);
    }
    let f0 = fetches(&b.sync(&sync(0, &[], 1), now));
    assert_eq!(f0.len(), 1);
    assert_eq!(f0[0].1, Some(HOLDER));
    let p = f0[0].0;
    assert!(fetches(&b.sync(&sync(1, &[], 1), now)).is_empty());
    assert!(fetches(&b.sync(&sync(2, &[], 1), now)).is_empty());
    // Member 0's fetch is about to end: the holder's next upload is chosen now, before the
    // piece is verified, for a member waiting, and of a piece no one fetches yet.
    b.woken();
    let ending = |m: u64, p: u32| SwarmSyncRequest {
        member: m,
        ending: vec![p],
        ..Default::default()
    };
    assert!(fetches(&b.sync(&ending(0, p), now)).is_empty());
    let woken = b.woken();
    assert_eq!(woken.len(), 1, "{woken:?}");
    let w = woken[0];
    let fw = fetches(&b.take_mail(w));
    assert_eq!(fw.len(), 1);
    assert_eq!(fw[0].1, Some(HOLDER));
    assert_ne!(fw[0].0, p);
    // That one ending too frees nothing more while the first freed upload still runs: a source
    // gets one upload ahead, not a heap of them.
    let other = if w == 1 { 2 } else { 1 };
    b.sync(&ending(w, fw[0].0), now);
    assert!(b.woken().is_empty());
    assert!(fetches(&b.take_mail(other)).is_empty());
    // The verification of a piece told ending frees nothing twice: the holder still sends to
    // w, and member 0 (now a holder of p) serves the member waiting.
    b.sync(&sync(0, &[p], 0), now);
    assert_eq!(fetches(&b.take_mail(other)), vec![(p, Some(0))]);
    // A fetch told ending that fails ends like any other.
    b.sync(&failed(w, fw[0].0, Some(HOLDER), WHY_BROKEN), now);
    let again = fetches(&b.sync(&sync(w, &[], 1), now));
    assert!(again.iter().all(|f| f.1 != Some(HOLDER)), "{again:?}");
}

#[test]
fn a_schedule_tells_a_fetch_ending_once_and_lines_up_one_more() {
    let mut s = Schedule::new(1, 4, ScheduleConfig::default());
    let grant = |p: u32| SwarmSyncReply {
        fetch: vec![SwarmFetch {
            piece: p,
            from: 9,
            store: false,
        }],
        ..Default::default()
    };
    s.sync_request();
    s.apply(&grant(0));
    assert_eq!(s.start().len(), 1);
    assert_eq!(s.idle(), 0);
    assert!(!s.ending(2), "not in flight");
    assert!(s.ending(0) && !s.ending(0));
    assert_eq!(s.idle(), 1, "its slot counts as free");
    let req = s.sync_request();
    assert_eq!((req.ending.clone(), req.idle), (vec![0], 1));
    // Lost on the way: told again.
    s.unsent(req);
    assert_eq!(s.sync_request().ending, vec![0]);
    s.apply(&grant(1));
    assert_eq!(s.start().len(), 1);
    assert!(s.ending(1));
    assert_eq!(
        s.idle(),
        0,
        "one lined up behind those ending, not one per ending fetch"
    );
    s.verified(0);
    assert_eq!(s.idle(), 1);
    assert_eq!(s.sync_request().ending, vec![1]);
    s.verified(1);
    assert!(s.sync_request().ending.is_empty());
}

#[test]
fn members_telling_fetches_ending_keep_uplinks_busy_and_finish_sooner() {
    // Small pieces, where the round trips between a source's uploads cost most.
    let cfg = |pace| SimConfig {
        pieces: 128,
        piece_bytes: 128 << 10,
        pace,
        ..small(60, 0.0)
    };
    let (with, without) = (sim::run(&cfg(true)), sim::run(&cfg(false)));
    assert_eq!((with.unfinished, without.unfinished), (0, 0));
    assert_eq!(with.busy_refusals, 0, "no source is asked beyond its slots");
    assert!(
        with.uplink_use > without.uplink_use + 0.03,
        "uplinks busy {:.2} with, {:.2} without",
        with.uplink_use,
        without.uplink_use
    );
    assert!(
        with.quantile(1.0) < without.quantile(1.0) - 0.05,
        "slowest {:.2} with, {:.2} without",
        with.quantile(1.0),
        without.quantile(1.0)
    );
}

#[test]
fn a_member_that_joins_again_tells_the_new_board_what_it_holds_and_nothing_of_the_old() {
    let mut s = Schedule::new(1, 4, ScheduleConfig { max_inflight: 2 });
    s.skip(3);
    s.sync_request();
    let from_peer = |piece| SwarmFetch {
        piece,
        from: 7,
        store: false,
    };
    s.apply(&SwarmSyncReply {
        fetch: vec![from_peer(0), from_peer(1)],
        ..Default::default()
    });
    assert_eq!(s.start().len(), 2);
    s.verified(0);
    s.sync_request();
    // Piece 1 is still coming from member 7 of the old board when the window's owner dies.
    s.apply(&SwarmSyncReply {
        fetch: vec![from_peer(2)],
        ..Default::default()
    });
    s.rejoined(5);
    assert!(s.news());
    let first = s.sync_request();
    assert_eq!(first.member, 5);
    assert_eq!((first.verified, first.skip), (vec![0], vec![3]));
    assert!(first.failed.is_empty());
    assert!(s.start().is_empty(), "the old board's choice is dropped");
    // The old fetch fails: the piece is wanted again, and the failure names no one.
    s.failed(1, From::Peer(7), Failure::Broken);
    assert!(s.sync_request().failed.is_empty());
    s.apply(&SwarmSyncReply {
        fetch: vec![from_peer(1)],
        ..Default::default()
    });
    assert_eq!(s.start().len(), 1);
    s.failed(1, From::Peer(7), Failure::Busy);
    assert_eq!(
        s.sync_request().failed.len(),
        1,
        "a new board's fetch is told"
    );
}
