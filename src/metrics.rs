//! What a process has done, for Prometheus: counters and latency histograms kept in atomics
//! (an increment is one relaxed add, so the hot paths pay nothing worth measuring), gauges read
//! when scraped, and the text exposition format (`GET /metrics` on the process's own port,
//! the port module of the transfers). Names and labels only: never a key, a path or data.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// A monotonic count.
pub struct Counter {
    name: &'static str,
    labels: &'static str,
    help: &'static str,
    value: AtomicU64,
}

impl Counter {
    pub const fn new(name: &'static str, labels: &'static str, help: &'static str) -> Self {
        Counter {
            name,
            labels,
            help,
            value: AtomicU64::new(0),
        }
    }

    pub fn add(&self, n: u64) {
        self.value.fetch_add(n, Ordering::Relaxed);
    }

    pub fn inc(&self) {
        self.add(1);
    }

    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// Upper bounds of latency buckets, in seconds: 100 µs to 30 s.
const BOUNDS: [f64; 12] = [
    0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0,
];

/// A latency distribution.
pub struct Histogram {
    name: &'static str,
    labels: &'static str,
    help: &'static str,
    buckets: [AtomicU64; BOUNDS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub const fn new(name: &'static str, labels: &'static str, help: &'static str) -> Self {
        Histogram {
            name,
            labels,
            help,
            buckets: [const { AtomicU64::new(0) }; BOUNDS.len()],
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = BOUNDS.iter().position(|b| s <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// Bytes and blocks this process served on the data plane.
pub static SERVED_BYTES: Counter = Counter::new(
    "kt_served_bytes_total",
    "",
    "Bytes of blocks served to others on the data plane.",
);
pub static SERVED_BLOCKS: Counter = Counter::new(
    "kt_served_blocks_total",
    "",
    "Blocks served to others on the data plane.",
);
pub static DENIED_REQUESTS: Counter = Counter::new(
    "kt_dataplane_denied_total",
    "",
    "Data-plane requests refused for want of a ticket that allows them.",
);
pub static REFUSED_CONNECTIONS: Counter = Counter::new(
    "kt_dataplane_refused_connections_total",
    "",
    "Data-plane connections closed at once: too many without a ticket, in all or from their address.",
);
pub static FETCHED_STORE_BYTES: Counter = Counter::new(
    "kt_fetched_bytes_total",
    "source=\"store\"",
    "Bytes of verified blocks fetched, by the kind of source.",
);
pub static FETCHED_PEER_BYTES: Counter = Counter::new(
    "kt_fetched_bytes_total",
    "source=\"peer\"",
    "Bytes of verified blocks fetched, by the kind of source.",
);
pub static UPLOADED_BYTES: Counter = Counter::new(
    "kt_uploaded_bytes_total",
    "",
    "Bytes of blocks uploaded to the store.",
);
pub static DELTA_BLOCKS: Counter = Counter::new(
    "kt_delta_blocks_total",
    "",
    "Blocks uploaded as an rsync delta against a block held here, rebuilt and verified.",
);
pub static DELTA_BYTES: Counter = Counter::new(
    "kt_delta_bytes_total",
    "",
    "Bytes of rsync deltas received for the blocks of kt_delta_blocks_total.",
);
pub static CACHE_HITS: Counter = Counter::new(
    "kt_cache_hits_total",
    "",
    "Block cache lookups that found the block.",
);
pub static CACHE_MISSES: Counter = Counter::new(
    "kt_cache_misses_total",
    "",
    "Block cache lookups that did not.",
);
pub static CACHE_EVICTIONS: Counter = Counter::new(
    "kt_cache_evictions_total",
    "",
    "Blocks evicted from the block cache.",
);
pub static CACHE_FULL_DISK: Counter = Counter::new(
    "kt_cache_full_disk_total",
    "",
    "Block cache writes that found the disk full before the cache's budget.",
);
pub static GC_BLOCKS: Counter = Counter::new(
    "kt_gc_blocks_total",
    "",
    "Blocks garbage collection deleted on the store.",
);
pub static GC_PASSES: Counter = Counter::new(
    "kt_gc_passes_total",
    "",
    "Garbage collection passes the store finished.",
);
pub static GC_BYTES: Counter = Counter::new(
    "kt_gc_bytes_total",
    "",
    "Bytes garbage collection gave back on the store.",
);
pub static AUTH_REFUSED: Counter = Counter::new(
    "kt_auth_refused_total",
    "",
    "Control-plane calls refused as unauthenticated.",
);
pub static WATCH_RECALLS: Counter = Counter::new(
    "kt_watch_recalls_total",
    "",
    "Changes sent to watching mounts (one per change and watcher).",
);
pub static SWARM_FREED_EARLY: Counter = Counter::new(
    "kt_swarm_uploads_freed_early_total",
    "",
    "Swarm uploads whose source was given its next before they ended, on their member's word that they were ending.",
);
pub static WATCH_LAPSED: Counter = Counter::new(
    "kt_watch_lapsed_total",
    "",
    "Watchers dropped because a change went unacknowledged until their lease ran out.",
);
pub static MOUNT_METADATA_REQUESTS: Counter = Counter::new(
    "kt_mount_metadata_requests_total",
    "",
    "Listings and resolves a mount asked the store server for (what its caches did not answer).",
);
pub static MOUNT_OPEN_RESOLVES: Counter = Counter::new(
    "kt_mount_open_resolves_total",
    "",
    "Opens that waited for a resolve of their own (nothing kept ahead answered them).",
);
pub static MOUNT_RESOLVED_AHEAD: Counter = Counter::new(
    "kt_mount_resolved_ahead_total",
    "",
    "Batches of a directory's small files a mount resolved in the background, ahead of a reader.",
);
pub static MOUNT_BLOCK_LOOKUPS: Counter = Counter::new(
    "kt_mount_block_lookups_total",
    "",
    "Looks a mount's reads took in what its node holds (one per block read, fetched or not).",
);
pub static KERNEL_SETTLE_WAITS: Counter = Counter::new(
    "kt_mount_kernel_forget_waits_total",
    "",
    "Changes a mount acknowledged before the kernel forgot their names (a request of its own held the directory).",
);
pub static READDIRPLUS_NAMES: Counter = Counter::new(
    "kt_mount_readdirplus_names_total",
    "",
    "Names a mount listed with their attributes (READDIRPLUS), which the kernel need not look up.",
);
pub static WRITEBACK_QUEUED: Counter = Counter::new(
    "kt_writeback_queued_total",
    "",
    "Closed files a write-back mount queued for publishing (a file changed again counts again).",
);
pub static WRITEBACK_PUBLISHED: Counter = Counter::new(
    "kt_writeback_published_total",
    "",
    "Queued files a write-back mount published.",
);
pub static WRITEBACK_RETRIES: Counter = Counter::new(
    "kt_writeback_retries_total",
    "",
    "Queued publishes that failed for a reason worth trying again (the server unreachable).",
);
pub static WRITEBACK_FAILED: Counter = Counter::new(
    "kt_writeback_failed_total",
    "",
    "Queued publishes the store server refused for good (their bytes are kept in the journal).",
);
pub static FETCH_SECONDS: Histogram = Histogram::new(
    "kt_fetch_seconds",
    "",
    "Time of one fetch of a set of blocks from ordered sources.",
);
pub static PUBLISH_SECONDS: Histogram = Histogram::new(
    "kt_store_publish_seconds",
    "",
    "Time the store server took to answer one publish of a key (a batch's publishes not counted).",
);
pub static FUSE_READ_SECONDS: Histogram = Histogram::new(
    "kt_fuse_op_seconds",
    "op=\"read\"",
    "Time of a filesystem operation in the mount's core.",
);
pub static FUSE_LOOKUP_SECONDS: Histogram = Histogram::new(
    "kt_fuse_op_seconds",
    "op=\"lookup\"",
    "Time of a filesystem operation in the mount's core.",
);
pub static FUSE_OPEN_SECONDS: Histogram = Histogram::new(
    "kt_fuse_op_seconds",
    "op=\"open\"",
    "Time of a filesystem operation in the mount's core.",
);
pub static FUSE_WRITE_SECONDS: Histogram = Histogram::new(
    "kt_fuse_op_seconds",
    "op=\"write\"",
    "Time of a filesystem operation in the mount's core.",
);
pub static FUSE_RELEASE_SECONDS: Histogram = Histogram::new(
    "kt_fuse_op_seconds",
    "op=\"release\"",
    "Time of a filesystem operation in the mount's core.",
);
pub static FUSE_FLUSH_SECONDS: Histogram = Histogram::new(
    "kt_fuse_op_seconds",
    "op=\"flush\"",
    "Time of a filesystem operation in the mount's core.",
);

static COUNTERS: [&Counter; 30] = [
    &MOUNT_METADATA_REQUESTS,
    &MOUNT_OPEN_RESOLVES,
    &MOUNT_RESOLVED_AHEAD,
    &MOUNT_BLOCK_LOOKUPS,
    &KERNEL_SETTLE_WAITS,
    &READDIRPLUS_NAMES,
    &WRITEBACK_QUEUED,
    &WRITEBACK_PUBLISHED,
    &WRITEBACK_RETRIES,
    &WRITEBACK_FAILED,
    &WATCH_RECALLS,
    &WATCH_LAPSED,
    &SWARM_FREED_EARLY,
    &SERVED_BYTES,
    &DELTA_BLOCKS,
    &DELTA_BYTES,
    &SERVED_BLOCKS,
    &DENIED_REQUESTS,
    &REFUSED_CONNECTIONS,
    &FETCHED_STORE_BYTES,
    &FETCHED_PEER_BYTES,
    &UPLOADED_BYTES,
    &CACHE_HITS,
    &CACHE_MISSES,
    &CACHE_EVICTIONS,
    &CACHE_FULL_DISK,
    &GC_BLOCKS,
    &GC_BYTES,
    &GC_PASSES,
    &AUTH_REFUSED,
];

static HISTOGRAMS: [&Histogram; 8] = [
    &FETCH_SECONDS,
    &PUBLISH_SECONDS,
    &FUSE_READ_SECONDS,
    &FUSE_LOOKUP_SECONDS,
    &FUSE_OPEN_SECONDS,
    &FUSE_WRITE_SECONDS,
    &FUSE_RELEASE_SECONDS,
    &FUSE_FLUSH_SECONDS,
];

/// Observes the time from its start to its drop into a histogram.
pub struct Timer {
    into: &'static Histogram,
    start: std::time::Instant,
}

impl Timer {
    pub fn start(into: &'static Histogram) -> Self {
        Timer {
            into,
            start: std::time::Instant::now(),
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.into.observe(self.start.elapsed());
    }
}

/// A value read when scraped (cache use, open windows, live nodes).
pub type GaugeFn = Box<dyn Fn() -> f64 + Send + Sync>;

struct Gauge {
    name: &'static str,
    help: &'static str,
    read: GaugeFn,
}

fn gauges() -> &'static Mutex<Vec<Gauge>> {
    static G: OnceLock<Mutex<Vec<Gauge>>> = OnceLock::new();
    G.get_or_init(Default::default)
}

/// Adds a gauge; one of the same name replaces it (a process that starts a server twice).
pub fn register_gauge(name: &'static str, help: &'static str, read: GaugeFn) {
    let mut g = crate::locks::lock(gauges());
    g.retain(|x| x.name != name);
    g.push(Gauge { name, help, read });
}

fn series(name: &str, labels: &str, extra: &str) -> String {
    let all: Vec<&str> = [labels, extra]
        .into_iter()
        .filter(|l| !l.is_empty())
        .collect();
    if all.is_empty() {
        name.to_string()
    } else {
        format!("{name}{{{}}}", all.join(","))
    }
}

/// The text exposition format (version 0.0.4) of everything above.
/// Whether this process serves what it is for, as `GET /ready` on its port answers (a plain
/// HTTP probe, which works where the port speaks TLS, unlike Kubernetes' gRPC probes): unset
/// (404: the process never said, as an agent does not), ready (200), not ready (503).
static READY: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Says whether this process is ready (see [`ready`]).
pub fn set_ready(ready: bool) {
    READY.store(if ready { 1 } else { 2 }, Ordering::Relaxed);
}

/// Whether this process is ready; `None` where it never said.
pub fn ready() -> Option<bool> {
    match READY.load(Ordering::Relaxed) {
        0 => None,
        r => Some(r == 1),
    }
}

pub fn render() -> String {
    let mut out = String::new();
    let mut described = std::collections::HashSet::new();
    let mut head = |out: &mut String, name: &'static str, help: &str, kind: &str| {
        if described.insert(name) {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        }
    };
    for c in COUNTERS {
        head(&mut out, c.name, c.help, "counter");
        let _ = writeln!(out, "{} {}", series(c.name, c.labels, ""), c.get());
    }
    for h in HISTOGRAMS {
        head(&mut out, h.name, h.help, "histogram");
        let mut cumulative = 0;
        for (b, n) in BOUNDS.iter().zip(&h.buckets) {
            cumulative += n.load(Ordering::Relaxed);
            let le = format!("le=\"{b}\"");
            let name = format!("{}_bucket", h.name);
            let _ = writeln!(out, "{} {cumulative}", series(&name, h.labels, &le));
        }
        let count = h.count();
        let inf = format!("{}_bucket", h.name);
        let _ = writeln!(out, "{} {count}", series(&inf, h.labels, "le=\"+Inf\""));
        let sum = h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "{} {sum}",
            series(&format!("{}_sum", h.name), h.labels, "")
        );
        let _ = writeln!(
            out,
            "{} {count}",
            series(&format!("{}_count", h.name), h.labels, "")
        );
    }
    for g in crate::locks::lock(gauges()).iter() {
        head(&mut out, g.name, g.help, "gauge");
        let _ = writeln!(out, "{} {}", g.name, (g.read)());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_holds_each_series_once_with_its_type() {
        FETCHED_STORE_BYTES.add(3);
        FUSE_LOOKUP_SECONDS.observe(Duration::from_millis(3));
        register_gauge("kt_test_gauge", "A test gauge.", Box::new(|| 2.5));
        let text = render();
        assert_eq!(
            text.matches("# TYPE kt_fetched_bytes_total counter")
                .count(),
            1
        );
        assert!(text.contains("kt_fetched_bytes_total{source=\"store\"} "));
        assert!(text.contains("# TYPE kt_fuse_op_seconds histogram"));
        assert!(text.contains("kt_fuse_op_seconds_bucket{op=\"lookup\",le=\"0.005\"} "));
        assert!(text.contains("kt_fuse_op_seconds_bucket{op=\"lookup\",le=\"+Inf\"} "));
        assert!(text.contains("kt_test_gauge 2.5"));
        assert_eq!(series("a", "", ""), "a");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (_, value) = line.rsplit_once(' ').unwrap();
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
