//! The swarm's own [`Board`] and [`Schedule`] against simulated nodes and links: every node has
//! an upload and a download limit, joins at its own time, and some die mid-transfer. Time moves
//! in steps; a sender sends to `fanout` requesters at once, first come first served, each an
//! equal share of its uplink (scaled down where the receiver's downlink cannot take the sum),
//! and keeps a bounded queue of the others. A node syncs with the board as a real member does:
//! at its join, after each fetch ends, and when the board has fetches for it while it waits;
//! every sync and every fetch starts one network delay later. The messages are the real
//! protobuf ones, so their sizes are what the wire would carry.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use prost::Message;

use super::{Board, Failure, From, Pace, Rng, Schedule, ScheduleConfig};

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub nodes: usize,
    pub pieces: u32,
    pub piece_bytes: u64,
    /// Bytes per second each node sends at most.
    pub upload: f64,
    /// Bytes per second each node receives at most.
    pub download: f64,
    /// Bytes per second the store sends at most.
    pub store_upload: f64,
    /// Joins are spread uniformly over this long after the publish.
    pub join_spread: Duration,
    /// Nodes that die at a random moment of their first transfer time, of all.
    pub die_fraction: f64,
    /// Downloaders the board asks a node to send to at once ([`super::DEFAULT_UPLOADS`]).
    pub fanout: u32,
    /// Requests a node (and the store) sends to at once, each an equal share of its uplink;
    /// later ones wait their turn. The real node's data plane serves four (`UPLOAD_SLOTS`):
    /// more than the board asks, so a source told free by an ending fetch sends the next
    /// beside it.
    pub sends: u32,
    /// Members tell the board of fetches about to end ([`super::Pace`]).
    pub pace: bool,
    /// Requests a sender keeps waiting beyond those it serves; more are answered "busy".
    pub queue: u32,
    /// Pieces fetched from the store at once ([`super::SEED_SLOTS`] in the real server).
    pub seed_slots: usize,
    /// One way between any two parties: a sync's answer, or a fetch's first byte, comes this
    /// long after it was sent.
    pub latency: Duration,
    /// A member waiting for fetches syncs again after this long even if the board has none for
    /// it (a real member's waiting sync ends then).
    pub poll: Duration,
    pub schedule: ScheduleConfig,
    pub seed: u64,
}

impl SimConfig {
    /// One transfer: the data at the rate one getter alone gets from the store.
    pub fn transfer_s(&self) -> f64 {
        self.data_bytes() as f64 / self.store_upload.min(self.download)
    }

    pub fn data_bytes(&self) -> u64 {
        self.piece_bytes * u64::from(self.pieces)
    }
}

#[derive(Clone, Debug, Default)]
pub struct SimReport {
    pub nodes: usize,
    pub died: usize,
    /// Nodes alive at the end without a whole copy (none, unless the run hit its time limit).
    pub unfinished: usize,
    pub transfer_s: f64,
    /// For every node that did not die: (time of its verified copy − its join) / `transfer_s`.
    /// The publish is at time 0 and no one joins before it.
    pub ratios: Vec<f64>,
    pub data_bytes: u64,
    pub store_bytes: u64,
    pub syncs: u64,
    /// Request bytes the server received and reply bytes it sent, as protobuf.
    pub sync_bytes_in: u64,
    pub sync_bytes_out: u64,
    /// Syncs in the busiest second.
    pub peak_syncs_per_s: u64,
    pub busy_refusals: u64,
    /// Fetches cut by a dying sender.
    pub broken_fetches: u64,
    /// Distinct members each node fetched from, on average: the connections it opened.
    pub sources_per_node: f64,
    /// Simulated seconds until the last node finished.
    pub span_s: f64,
    /// When the store sent its last byte.
    pub store_last_s: f64,
    /// Bytes sent by the nodes over what their uplinks could have sent while any node was
    /// still fetching (after its join, before it died).
    pub uplink_use: f64,
    /// Bytes received over what the downlinks of the nodes still fetching could have taken.
    pub downlink_use: f64,
}

impl SimReport {
    /// The `q` quantile (0..=1) of the completion ratios.
    pub fn quantile(&self, q: f64) -> f64 {
        let mut v = self.ratios.clone();
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(f64::total_cmp);
        let i = ((v.len() - 1) as f64 * q).round() as usize;
        v[i.min(v.len() - 1)]
    }

    pub fn store_ratio(&self) -> f64 {
        self.store_bytes as f64 / self.data_bytes as f64
    }
}

struct Node {
    join_at: f64,
    die_at: Option<f64>,
    joined: bool,
    dead: bool,
    done_at: Option<f64>,
    next_sync: f64,
    sched: Option<Schedule>,
    pace: Pace,
    dirty: bool,
}

struct Flow {
    to: usize,
    /// The sender: a node, or `nodes.len()` for the store.
    from: usize,
    piece: u32,
    left: f64,
    /// Its first byte leaves the sender then.
    start_at: f64,
}

/// Runs one simulation to its end: every node done or dead, or ten transfer times past the
/// last join.
pub fn run(cfg: &SimConfig) -> SimReport {
    let base = Instant::now();
    let at = |t: f64| base + Duration::from_secs_f64(t);
    let mut rng = Rng::new(cfg.seed);
    let transfer_s = cfg.transfer_s();
    let piece_s = cfg.piece_bytes as f64 / cfg.upload.min(cfg.download);
    let lat = cfg.latency.as_secs_f64();
    let poll = cfg.poll.as_secs_f64();
    let dt = (piece_s / 40.0).max(1e-4);
    let spread = cfg.join_spread.as_secs_f64();
    let limit = spread + 10.0 * transfer_s;
    let sends = cfg.sends.max(1) as usize;

    let mut nodes: Vec<Node> = (0..cfg.nodes)
        .map(|_| {
            let join_at = rng.unit() * spread;
            let die_at = (rng.unit() < cfg.die_fraction).then(|| join_at + rng.unit() * transfer_s);
            Node {
                join_at,
                die_at,
                joined: false,
                dead: false,
                done_at: None,
                next_sync: join_at,
                sched: None,
                pace: Pace::default(),
                dirty: false,
            }
        })
        .collect();
    let store = nodes.len();
    let mut board = Board::with_slots(cfg.pieces, cfg.seed_slots, cfg.fanout, cfg.seed);
    let mut flows: BTreeMap<u64, Flow> = BTreeMap::new();
    // Each sender's requests in arrival order; the first `fanout` are being sent.
    let mut queues: Vec<VecDeque<u64>> = vec![VecDeque::new(); nodes.len() + 1];
    let mut next_flow = 0u64;
    let mut pairs: std::collections::HashSet<(usize, usize)> = Default::default();
    let mut r = SimReport {
        nodes: cfg.nodes,
        transfer_s,
        data_bytes: cfg.data_bytes(),
        ..Default::default()
    };
    let mut store_bytes = 0f64;
    let mut peer_bytes = 0f64;
    let mut uplink_s = 0f64;
    let mut downlink_s = 0f64;
    let mut syncs_this_second = (0i64, 0u64);
    let mut t = 0.0;
    loop {
        let now = at(t);
        // Joins and deaths.
        for (i, n) in nodes.iter_mut().enumerate() {
            if !n.joined && n.join_at <= t {
                n.joined = true;
                board.join(i as u64, "", true);
                n.sched = Some(Schedule::new(i as u64, cfg.pieces, cfg.schedule.clone()));
            }
        }
        for i in 0..nodes.len() {
            let n = &mut nodes[i];
            if n.dead || n.done_at.is_some() || n.die_at.is_none_or(|d| d > t) {
                continue;
            }
            n.dead = true;
            n.sched = None;
            r.died += 1;
            board.leave(i as u64, false);
            let cut: Vec<u64> = flows
                .iter()
                .filter(|(_, f)| f.to == i || f.from == i)
                .map(|(&k, _)| k)
                .collect();
            for k in cut {
                let Some(f) = flows.remove(&k) else { continue };
                queues[f.from].retain(|&x| x != k);
                if f.to != i {
                    r.broken_fetches += 1;
                    let to = &mut nodes[f.to];
                    if let Some(s) = to.sched.as_mut() {
                        s.failed(f.piece, From::Peer(i as u64), Failure::Broken);
                    }
                    to.pace.ended(f.piece, false, now);
                    to.dirty = true;
                    to.next_sync = to.next_sync.min(t + lat);
                }
            }
        }
        // Fetches about to end.
        if cfg.pace {
            for n in nodes.iter_mut() {
                let Some(s) = n.sched.as_mut() else { continue };
                if n.dead || n.pace.next_due().is_none_or(|d| d > now) {
                    continue;
                }
                for p in n.pace.due(now) {
                    if s.ending(p) {
                        n.next_sync = n.next_sync.min(t + lat);
                    }
                }
            }
        }
        // Syncs: at a join, after a fetch ended, when the board has fetches for a member, and
        // every `poll` while a member waits.
        for i in 0..nodes.len() {
            let n = &mut nodes[i];
            if !n.joined || n.dead || n.next_sync > t {
                continue;
            }
            let Some(s) = n.sched.as_mut() else { continue };
            if !s.news() && s.idle() == 0 && !board.has_mail(i as u64) {
                n.next_sync = f64::INFINITY;
                continue;
            }
            let req = s.sync_request();
            let reply = board.sync(&req, now);
            // A sync is answered at once here: its round trip is the two ways' latency.
            n.pace.round_trip(2 * cfg.latency);
            s.apply(&reply);
            r.syncs += 1;
            r.sync_bytes_in += req.encoded_len() as u64;
            r.sync_bytes_out += reply.encoded_len() as u64;
            let sec = t.floor() as i64;
            if syncs_this_second.0 != sec {
                syncs_this_second = (sec, 0);
            }
            syncs_this_second.1 += 1;
            r.peak_syncs_per_s = r.peak_syncs_per_s.max(syncs_this_second.1);
            n.next_sync = if s.news() {
                t + lat
            } else if s.idle() > 0 {
                t + poll
            } else {
                f64::INFINITY
            };
            n.dirty = true;
            for w in board.woken() {
                if let Some(x) = nodes.get_mut(w as usize) {
                    x.next_sync = x.next_sync.min(t + lat);
                }
            }
        }
        // New fetches.
        for i in 0..nodes.len() {
            if !nodes[i].dirty || nodes[i].dead {
                continue;
            }
            nodes[i].dirty = false;
            for _round in 0..4 {
                let Some(s) = nodes[i].sched.as_mut() else {
                    break;
                };
                let reqs = s.start();
                if reqs.is_empty() {
                    break;
                }
                let mut refused = false;
                for q in reqs {
                    let from = match q.from {
                        From::Seed => store,
                        From::Peer(p) => p as usize,
                    };
                    let why = if from != store && nodes.get(from).is_none_or(|x| x.dead) {
                        Some(Failure::Broken)
                    } else if queues[from].len() >= sends + cfg.queue as usize {
                        r.busy_refusals += 1;
                        Some(Failure::Busy)
                    } else {
                        None
                    };
                    if let Some(why) = why {
                        if let Some(s) = nodes[i].sched.as_mut() {
                            s.failed(q.piece, q.from, why);
                        }
                        nodes[i].pace.ended(q.piece, false, now);
                        nodes[i].next_sync = nodes[i].next_sync.min(t + lat);
                        refused = true;
                        continue;
                    }
                    next_flow += 1;
                    nodes[i].pace.started(q.piece, cfg.piece_bytes, now);
                    if from != store {
                        pairs.insert((i, from));
                    }
                    queues[from].push_back(next_flow);
                    flows.insert(
                        next_flow,
                        Flow {
                            to: i,
                            from,
                            piece: q.piece,
                            left: cfg.piece_bytes as f64,
                            start_at: t + 2.0 * lat,
                        },
                    );
                }
                if !refused {
                    break;
                }
            }
        }
        // Rates: an equal share of the sender's uplink among those it sends to, scaled to the
        // receiver's downlink.
        let share = |u: usize, k: u64, q: &[VecDeque<u64>]| -> f64 {
            let sending = q[u].len().min(sends);
            if !q[u].iter().take(sends).any(|&x| x == k) {
                return 0.0;
            }
            let cap = if u == store {
                cfg.store_upload
            } else {
                cfg.upload
            };
            cap / sending as f64
        };
        let mut want = vec![0f64; nodes.len()];
        for (&k, f) in &flows {
            if f.start_at <= t {
                want[f.to] += share(f.from, k, &queues);
            }
        }
        let mut finished = Vec::new();
        for (&k, f) in flows.iter_mut() {
            if f.start_at > t {
                continue;
            }
            let rate = share(f.from, k, &queues);
            if rate == 0.0 {
                continue;
            }
            let scale = if want[f.to] > cfg.download {
                cfg.download / want[f.to]
            } else {
                1.0
            };
            let sent = (rate * scale * dt).min(f.left);
            f.left -= sent;
            if f.from == store {
                store_bytes += sent;
                r.store_last_s = t;
            } else {
                peer_bytes += sent;
            }
            if f.left <= 1e-6 {
                finished.push(k);
            }
        }
        for k in finished {
            let Some(f) = flows.remove(&k) else { continue };
            queues[f.from].retain(|&x| x != k);
            let n = &mut nodes[f.to];
            n.dirty = true;
            if let Some(s) = n.sched.as_mut() {
                s.verified(f.piece);
                n.pace.ended(f.piece, true, now);
                n.next_sync = n.next_sync.min(t + lat);
                if s.done() && n.done_at.is_none() {
                    n.done_at = Some(t + dt);
                }
            }
        }
        let uplinks = nodes.iter().filter(|n| n.joined && !n.dead).count();
        let fetching = nodes
            .iter()
            .filter(|n| n.joined && !n.dead && n.done_at.is_none())
            .count();
        uplink_s += uplinks as f64 * dt;
        downlink_s += fetching as f64 * dt;
        t += dt;
        let settled = nodes
            .iter()
            .all(|n| n.joined && (n.dead || n.done_at.is_some()));
        if settled || t > limit {
            break;
        }
    }
    for n in &nodes {
        if n.dead {
            continue;
        }
        match n.done_at {
            Some(d) => {
                r.ratios.push((d - n.join_at) / transfer_s);
                r.span_s = r.span_s.max(d);
            }
            None => r.unfinished += 1,
        }
    }
    r.store_bytes = store_bytes.round() as u64;
    r.sources_per_node = pairs.len() as f64 / cfg.nodes.max(1) as f64;
    r.uplink_use = peer_bytes / (uplink_s * cfg.upload).max(1.0);
    r.downlink_use = (peer_bytes + store_bytes) / (downlink_s * cfg.download).max(1.0);
    r
}
