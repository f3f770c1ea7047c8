//! An explicit fanout over NCCL: a pipelined tree of sends and receives of that degree, each
//! unit of bytes going down it in chunks, one NCCL group per step in which a member receives a
//! chunk from its parent and passes the one before to its children.

use std::time::Instant;

use super::error::WorkerError;
use crate::gpu::cuda::{Comm, DeviceRange, Stream};

/// The chunk a pipelined tree moves per step: a member passes a chunk on while it receives
/// the next, so a tree of depth d costs about d chunks more than one copy.
pub const TREE_CHUNK: usize = 4 << 20;

/// This rank's parent and children in a tree of degree `fanout` rooted at `root` over
/// `nranks` ranks: the tree of ranks counted from the root (rank `root + v` has children
/// `root + fanout*v + 1 ..= root + fanout*v + fanout`, all modulo `nranks`), which with the
/// root at rank 0 is the tree the server plans.
pub fn tree_place(
    rank: usize,
    root: usize,
    nranks: usize,
    fanout: usize,
) -> (Option<usize>, Vec<usize>) {
    let fanout = fanout.max(1);
    let v = (rank + nranks - root) % nranks;
    let real = |v: usize| (v + root) % nranks;
    let parent = (v > 0).then(|| real((v - 1) / fanout));
    let children = (1..=fanout)
        .map(|i| fanout * v + i)
        .filter(|&c| c < nranks)
        .map(real)
        .collect();
    (parent, children)
}

/// A tree member's steps over `chunks` chunks: per step, the chunk it receives from its parent
/// and the chunk it sends its children. The root sends chunk s at step s; any other member
/// receives chunk s at step s and passes on chunk s - 1, which the step before received (the
/// steps run in order on one stream).
fn tree_steps(chunks: usize, root: bool) -> Vec<(Option<usize>, Option<usize>)> {
    if root {
        (0..chunks).map(|s| (None, Some(s))).collect()
    } else {
        (0..=chunks)
            .map(|s| ((s < chunks).then_some(s), s.checked_sub(1)))
            .collect()
    }
}

/// Moves `unit` (the root's bytes, every other member's to fill) down the tree `place` gives
/// (from [`tree_place`]), chunk by chunk, enqueued on `stream`.
pub fn tree_unit(
    comm: &Comm,
    unit: DeviceRange<'_>,
    place: &(Option<usize>, Vec<usize>),
    stream: &Stream,
    deadline: Instant,
) -> Result<(), WorkerError> {
    let (parent, children) = place;
    let chunks = unit.len().div_ceil(TREE_CHUNK);
    let chunk = |c: usize| {
        let at = c * TREE_CHUNK;
        unit.slice(at, TREE_CHUNK.min(unit.len() - at))
    };
    for (recv, send) in tree_steps(chunks, parent.is_none()) {
        let send = send.filter(|_| !children.is_empty());
        if recv.is_none() && send.is_none() {
            continue;
        }
        comm.group(deadline, |g| {
            if let (Some(c), Some(p)) = (recv, *parent) {
                g.recv(chunk(c)?, p, stream)?;
            }
            if let Some(c) = send {
                for &child in children {
                    g.send(chunk(c)?, child, stream)?;
                }
            }
            Ok(())
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_has_one_parent_whose_children_it_is_in_a_tree_of_any_root_and_degree() {
        for nranks in 1..12 {
            for root in 0..nranks {
                for fanout in 1..5 {
                    let places: Vec<_> = (0..nranks)
                        .map(|r| tree_place(r, root, nranks, fanout))
                        .collect();
                    for (r, (parent, children)) in places.iter().enumerate() {
                        assert!(children.len() <= fanout);
                        match parent {
                            None => assert_eq!(r, root),
                            Some(p) => assert!(places[*p].1.contains(&r), "{r} not {p}'s child"),
                        }
                        for c in children {
                            assert_eq!(places[*c].0, Some(r));
                        }
                    }
                    // Every rank is reached from the root, within the depth of a full tree.
                    let mut depth = vec![None; nranks];
                    depth[root] = Some(0);
                    let mut todo = vec![root];
                    while let Some(r) = todo.pop() {
                        for &c in &places[r].1 {
                            depth[c] = depth[r].map(|d: usize| d + 1);
                            todo.push(c);
                        }
                    }
                    let full = |d: u32| (0..=d).map(|i| fanout.pow(i)).sum::<usize>();
                    let deepest = depth.iter().map(|d| d.unwrap()).max().unwrap();
                    assert!(deepest == 0 || full(deepest as u32 - 1) < nranks);
                }
            }
        }
        // With the root at rank 0: the server's tree (parent of rank r is rank (r - 1) / f).
        for r in 1..9 {
            assert_eq!(tree_place(r, 0, 9, 2).0, Some((r - 1) / 2));
        }
        // A chain.
        assert_eq!(tree_place(2, 0, 4, 1), (Some(1), vec![3]));
    }

    #[test]
    fn a_tree_member_passes_on_each_chunk_the_step_after_it_came() {
        assert_eq!(
            tree_steps(3, true),
            vec![(None, Some(0)), (None, Some(1)), (None, Some(2))]
        );
        assert_eq!(
            tree_steps(3, false),
            vec![
                (Some(0), None),
                (Some(1), Some(0)),
                (Some(2), Some(1)),
                (None, Some(2))
            ]
        );
        assert!(tree_steps(0, true).is_empty());
        assert_eq!(tree_steps(0, false), vec![(None, None)]);
    }
}
