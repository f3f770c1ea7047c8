//! The swarm's own [`Board`] and [`Schedule`] against simulated nodes and links: every node has
//! an upload and a download limit, joins at its own time, and some die mid-transfer. Time moves
//! in steps; a sender sends to `fanout` requesters at once, first come first served, each an
//! equal share of its uplink (scaled down where the receiver's downlink cannot take the sum),
//! and keeps a bounded queue of the others. A node syncs with the board as a real member does:
//! at its join, after each fetch ends, and when the board has fetches for it while it waits;
//! every sync and every fetch starts one network delay later. The messages are the real
//! protobuf ones, so their sizes are what the wire would carry.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use prost::Message;

use super::board::Board;
use super::pace::Pace;
use super::rng::Rng;
use super::schedule::{Failure, From, Schedule, ScheduleConfig};

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
    let mut sim = Sim::new(cfg);
    loop {
        let now = sim.at(sim.t);
        sim.join_and_die(now);
        if cfg.pace {
            sim.tell_endings(now);
        }
        sim.sync(now);
        sim.start_fetches(now);
        let finished = sim.send();
        sim.land(finished, now);
        if sim.tick() {
            break;
        }
    }
    sim.report()
}

/// One simulation's state, moved one step of `dt` at a time.
struct Sim<'a> {
    cfg: &'a SimConfig,
    base: Instant,
    transfer_s: f64,
    /// One way's latency, the poll of a waiting member and the step, in seconds.
    lat: f64,
    poll: f64,
    dt: f64,
    limit: f64,
    /// Requests a sender sends to at once.
    sends: usize,
    nodes: Vec<Node>,
    /// The store's place among the senders (after every node).
    store: usize,
    board: Board,
    flows: BTreeMap<u64, Flow>,
    /// Each sender's requests in arrival order; the first `sends` are being sent.
    queues: Vec<VecDeque<u64>>,
    next_flow: u64,
    /// (receiver, sender) pairs that ever had a fetch between them.
    pairs: HashSet<(usize, usize)>,
    r: SimReport,
    store_bytes: f64,
    peer_bytes: f64,
    /// Seconds of uplink of the nodes alive, and of downlink of those still fetching.
    uplink_s: f64,
    downlink_s: f64,
    /// Syncs in the current second: (the second, how many).
    syncs_this_second: (i64, u64),
    t: f64,
}

impl<'a> Sim<'a> {
    /// Every node's join time and death drawn, none joined yet.
    fn new(cfg: &'a SimConfig) -> Self {
        let mut rng = Rng::new(cfg.seed);
        let transfer_s = cfg.transfer_s();
        let piece_s = cfg.piece_bytes as f64 / cfg.upload.min(cfg.download);
        let spread = cfg.join_spread.as_secs_f64();
        let nodes: Vec<Node> = (0..cfg.nodes)
            .map(|_| {
                let join_at = rng.unit() * spread;
                let die_at =
                    (rng.unit() < cfg.die_fraction).then(|| join_at + rng.unit() * transfer_s);
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
        Sim {
            cfg,
            base: Instant::now(),
            transfer_s,
            lat: cfg.latency.as_secs_f64(),
            poll: cfg.poll.as_secs_f64(),
            dt: (piece_s / 40.0).max(1e-4),
            limit: spread + 10.0 * transfer_s,
            sends: cfg.sends.max(1) as usize,
            store: nodes.len(),
            board: Board::with_slots(cfg.pieces, cfg.seed_slots, cfg.fanout, cfg.seed),
            flows: BTreeMap::new(),
            queues: vec![VecDeque::new(); nodes.len() + 1],
            next_flow: 0,
            pairs: HashSet::new(),
            r: SimReport {
                nodes: cfg.nodes,
                transfer_s,
                data_bytes: cfg.data_bytes(),
                ..Default::default()
            },
            store_bytes: 0.0,
            peer_bytes: 0.0,
            uplink_s: 0.0,
            downlink_s: 0.0,
            syncs_this_second: (0, 0),
            t: 0.0,
            nodes,
        }
    }

    /// The instant of simulated time `t`.
    fn at(&self, t: f64) -> Instant {
        self.base + Duration::from_secs_f64(t)
    }

    /// Nodes whose time has come join; those whose time has come die, and the fetches to and
    /// from them are cut (their receivers count them broken).
    fn join_and_die(&mut self, now: Instant) {
        let (t, lat) = (self.t, self.lat);
        for (i, n) in self.nodes.iter_mut().enumerate() {
            if !n.joined && n.join_at <= t {
                n.joined = true;
                self.board.join(i as u64, "", true);
                n.sched = Some(Schedule::new(
                    i as u64,
                    self.cfg.pieces,
                    self.cfg.schedule.clone(),
                ));
            }
        }
        for i in 0..self.nodes.len() {
            let n = &mut self.nodes[i];
            if n.dead || n.done_at.is_some() || n.die_at.is_none_or(|d| d > t) {
                continue;
            }
            n.dead = true;
            n.sched = None;
            self.r.died += 1;
            self.board.leave(i as u64, false);
            let cut: Vec<u64> = self
                .flows
                .iter()
                .filter(|(_, f)| f.to == i || f.from == i)
                .map(|(&k, _)| k)
                .collect();
            for k in cut {
                let Some(f) = self.flows.remove(&k) else {
                    continue;
                };
                self.queues[f.from].retain(|&x| x != k);
                if f.to != i {
                    self.r.broken_fetches += 1;
                    let to = &mut self.nodes[f.to];
                    if let Some(s) = to.sched.as_mut() {
                        s.failed(f.piece, From::Peer(i as u64), Failure::Broken);
                    }
                    to.pace.ended(f.piece, false, now);
                    to.dirty = true;
                    to.next_sync = to.next_sync.min(t + lat);
                }
            }
        }
    }

    /// Members tell their schedules of fetches about to end, and sync soon to tell the board.
    fn tell_endings(&mut self, now: Instant) {
        let (t, lat) = (self.t, self.lat);
        for n in self.nodes.iter_mut() {
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

    /// Syncs: at a join, after a fetch ended, when the board has fetches for a member, and
    /// every `poll` while a member waits.
    fn sync(&mut self, now: Instant) {
        let (t, lat, poll) = (self.t, self.lat, self.poll);
        for i in 0..self.nodes.len() {
            let n = &mut self.nodes[i];
            if !n.joined || n.dead || n.next_sync > t {
                continue;
            }
            let Some(s) = n.sched.as_mut() else { continue };
            if !s.news() && s.idle() == 0 && !self.board.has_mail(i as u64) {
                n.next_sync = f64::INFINITY;
                continue;
            }
            let req = s.sync_request();
            let reply = self.board.sync(&req, now);
            // A sync is answered at once here: its round trip is the two ways' latency.
            n.pace.round_trip(2 * self.cfg.latency);
            s.apply(&reply);
            self.r.syncs += 1;
            self.r.sync_bytes_in += req.encoded_len() as u64;
            self.r.sync_bytes_out += reply.encoded_len() as u64;
            let sec = t.floor() as i64;
            if self.syncs_this_second.0 != sec {
                self.syncs_this_second = (sec, 0);
            }
            self.syncs_this_second.1 += 1;
            self.r.peak_syncs_per_s = self.r.peak_syncs_per_s.max(self.syncs_this_second.1);
            n.next_sync = if s.news() {
                t + lat
            } else if s.idle() > 0 {
                t + poll
            } else {
                f64::INFINITY
            };
            n.dirty = true;
            for w in self.board.woken() {
                if let Some(x) = self.nodes.get_mut(w as usize) {
                    x.next_sync = x.next_sync.min(t + lat);
                }
            }
        }
    }

    /// Members whose schedules changed start the fetches they say: a request to a dead
    /// sender is broken, one to a sender whose queue is full is answered busy (and the
    /// schedule asked again, a few rounds at most).
    fn start_fetches(&mut self, now: Instant) {
        for i in 0..self.nodes.len() {
            if !self.nodes[i].dirty || self.nodes[i].dead {
                continue;
            }
            self.nodes[i].dirty = false;
            for _round in 0..4 {
                let Some(s) = self.nodes[i].sched.as_mut() else {
                    break;
                };
                let reqs = s.start();
                if reqs.is_empty() {
                    break;
                }
                let mut refused = false;
                for q in reqs {
                    refused |= !self.start_fetch(i, q.piece, q.from, now);
                }
                if !refused {
                    break;
                }
            }
        }
    }

    /// Node `i` starts fetching `piece` from `from`; false if it was refused at once.
    fn start_fetch(&mut self, i: usize, piece: u32, from: From, now: Instant) -> bool {
        let (store, t, lat) = (self.store, self.t, self.lat);
        let sender = match from {
            From::Seed => store,
            From::Peer(p) => p as usize,
        };
        let why = if sender != store && self.nodes.get(sender).is_none_or(|x| x.dead) {
            Some(Failure::Broken)
        } else if self.queues[sender].len() >= self.sends + self.cfg.queue as usize {
            self.r.busy_refusals += 1;
            Some(Failure::Busy)
        } else {
            None
        };
        let n = &mut self.nodes[i];
        if let Some(why) = why {
            if let Some(s) = n.sched.as_mut() {
                s.failed(piece, from, why);
            }
            n.pace.ended(piece, false, now);
            n.next_sync = n.next_sync.min(t + lat);
            return false;
        }
        self.next_flow += 1;
        n.pace.started(piece, self.cfg.piece_bytes, now);
        if sender != store {
            self.pairs.insert((i, sender));
        }
        self.queues[sender].push_back(self.next_flow);
        self.flows.insert(
            self.next_flow,
            Flow {
                to: i,
                from: sender,
                piece,
                left: self.cfg.piece_bytes as f64,
                start_at: t + 2.0 * lat,
            },
        );
        true
    }

    /// Rate of flow `k` from `u`: an equal share of the sender's uplink among those it sends
    /// to (0 if `k` waits in its queue).
    fn share(&self, u: usize, k: u64) -> f64 {
        let q = &self.queues[u];
        let sending = q.len().min(self.sends);
        if !q.iter().take(self.sends).any(|&x| x == k) {
            return 0.0;
        }
        let cap = if u == self.store {
            self.cfg.store_upload
        } else {
            self.cfg.upload
        };
        cap / sending as f64
    }

    /// One step of sending: each flow at its share of its sender's uplink, scaled to its
    /// receiver's downlink. Returns the flows whose piece arrived whole.
    fn send(&mut self) -> Vec<u64> {
        let t = self.t;
        let mut want = vec![0f64; self.nodes.len()];
        for (&k, f) in &self.flows {
            if f.start_at <= t {
                want[f.to] += self.share(f.from, k);
            }
        }
        let rates: Vec<(u64, f64)> = self
            .flows
            .iter()
            .filter(|(_, f)| f.start_at <= t)
            .map(|(&k, f)| (k, self.share(f.from, k)))
            .collect();
        let mut finished = Vec::new();
        for (k, rate) in rates {
            if rate == 0.0 {
                continue;
            }
            let Some(f) = self.flows.get_mut(&k) else {
                continue;
            };
            let scale = if want[f.to] > self.cfg.download {
                self.cfg.download / want[f.to]
            } else {
                1.0
            };
            let sent = (rate * scale * self.dt).min(f.left);
            f.left -= sent;
            if f.from == self.store {
                self.store_bytes += sent;
                self.r.store_last_s = t;
            } else {
                self.peer_bytes += sent;
            }
            if f.left <= 1e-6 {
                finished.push(k);
            }
        }
        finished
    }

    /// The pieces of `finished` flows arrive: verified, and their members sync soon.
    fn land(&mut self, finished: Vec<u64>, now: Instant) {
        for k in finished {
            let Some(f) = self.flows.remove(&k) else {
                continue;
            };
            self.queues[f.from].retain(|&x| x != k);
            let n = &mut self.nodes[f.to];
            n.dirty = true;
            if let Some(s) = n.sched.as_mut() {
                s.verified(f.piece);
                n.pace.ended(f.piece, true, now);
                n.next_sync = n.next_sync.min(self.t + self.lat);
                if s.done() && n.done_at.is_none() {
                    n.done_at = Some(self.t + self.dt);
                }
            }
        }
    }

    /// Counts the step's link time and moves time on; true once every node is settled or
    /// the time limit is past.
    fn tick(&mut self) -> bool {
        let uplinks = self.nodes.iter().filter(|n| n.joined && !n.dead).count();
        let fetching = self
            .nodes
            .iter()
            .filter(|n| n.joined && !n.dead && n.done_at.is_none())
            .count();
        self.uplink_s += uplinks as f64 * self.dt;
        self.downlink_s += fetching as f64 * self.dt;
        self.t += self.dt;
        let settled = self
            .nodes
            .iter()
            .all(|n| n.joined && (n.dead || n.done_at.is_some()));
        settled || self.t > self.limit
    }

    fn report(mut self) -> SimReport {
        let cfg = self.cfg;
        let r = &mut self.r;
        for n in &self.nodes {
            if n.dead {
                continue;
            }
            match n.done_at {
                Some(d) => {
                    r.ratios.push((d - n.join_at) / self.transfer_s);
                    r.span_s = r.span_s.max(d);
                }
                None => r.unfinished += 1,
            }
        }
        r.store_bytes = self.store_bytes.round() as u64;
        r.sources_per_node = self.pairs.len() as f64 / cfg.nodes.max(1) as f64;
        r.uplink_use = self.peer_bytes / (self.uplink_s * cfg.upload).max(1.0);
        r.downlink_use =
            (self.peer_bytes + self.store_bytes) / (self.downlink_s * cfg.download).max(1.0);
        self.r
    }
}
