//! `kt-gpu-check`: checks on a GPU machine, end to end, what `ktfs::gpu::cuda` promises, and
//! prints one JSON report on stdout.
//!
//! The checks, in order: the probe; memory on a device (a round trip through the host); CUDA
//! IPC (a child process maps this one's memory, reads it and writes it, both verified by
//! blake3 digest); an NCCL broadcast between two ranks in two processes (on two GPUs when
//! there are two, else both on one GPU over loopback sockets, NCCL's one way to run two ranks
//! on one GPU: a different `NCCL_HOSTID` each and no P2P or shared memory); and the init
//! deadline (a rank whose peer never comes fails by its deadline with a clear error, and the
//! process can make a working communicator afterwards); and the throughput of a large transfer
//! (`--big-bytes`, 4 GiB) on one GPU, a one-rank NCCL broadcast beside a device-to-device copy.
//!
//! Exit status: 0 when every check passed, 1 when one failed, 2 when there is no CUDA here
//! (the report's `status` is then `not_available`), 64 for bad arguments. Every child process
//! is killed at its deadline, so the check always ends.
//!
//! pip's NCCL (`libnccl.so.2`) is not a name the bindings load; when NCCL does not load, the
//! check finds that library, links it in a scratch directory and runs itself again with that
//! directory on `LD_LIBRARY_PATH` (the loader reads it only at process start).

mod child;
mod procs;

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use ktfs::gpu::cuda::{self, ipc, probe, Comm, Device, Stream, UniqueId};
use serde_json::{json, Value};

/// Set in the environment of the check run again with NCCL on `LD_LIBRARY_PATH`: the library.
const REEXEC_ENV: &str = "KT_GPU_CHECK_NCCL";

const USAGE: &str =
    "usage: kt-gpu-check [--bytes N] [--big-bytes N] [--device N] [--abort-deadline-ms N]";

struct Options {
    bytes: usize,
    /// The size of the throughput check's transfer.
    big_bytes: usize,
    device: i32,
    abort_deadline: Duration,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options, String> {
        let mut o = Options {
            bytes: 64 << 20,
            big_bytes: 4 << 30,
            device: 0,
            abort_deadline: Duration::from_secs(5),
        };
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let mut value = || {
                it.next()
                    .ok_or_else(|| format!("{flag} needs a value"))
                    .cloned()
            };
            let bad = |v: &str| format!("{flag} {v:?} is not valid");
            match flag.as_str() {
                "--bytes" => {
                    let v = value()?;
                    o.bytes = v.parse().ok().filter(|&b| b > 0).ok_or_else(|| bad(&v))?;
                }
                "--big-bytes" => {
                    let v = value()?;
                    o.big_bytes = v.parse().ok().filter(|&b| b > 0).ok_or_else(|| bad(&v))?;
                }
                "--device" => {
                    let v = value()?;
                    o.device = v.parse().ok().filter(|&d| d >= 0).ok_or_else(|| bad(&v))?;
                }
                "--abort-deadline-ms" => {
                    let v = value()?;
                    let ms: u64 = v.parse().ok().filter(|&m| m > 0).ok_or_else(|| bad(&v))?;
                    o.abort_deadline = Duration::from_millis(ms);
                }
                "-h" | "--help" => return Err(String::new()),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(o)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        std::process::exit(child::run(&args[1..]));
    }
    let opts = match Options::parse(&args) {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("kt-gpu-check: {e}");
            }
            eprintln!("{USAGE}");
            std::process::exit(if e.is_empty() { 0 } else { 64 });
        }
    };
    // Every NCCL bootstrap of this check (its own and its children's) stays on this machine.
    if std::env::var_os("NCCL_SOCKET_IFNAME").is_none() {
        std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
    }
    let nccl_library = nccl_library_or_reexec();
    let report = run_checks(&opts, nccl_library);
    println!(
        "{}",
        serde_json::to_string_pretty(&report.json).expect("a JSON value prints")
    );
    std::process::exit(report.code);
}

/// Where NCCL was loaded from, as the report says it; runs the check again (and does not
/// return) when NCCL does not load by the bindings' names but a library was found.
fn nccl_library_or_reexec() -> Value {
    if let Some(lib) = std::env::var_os(REEXEC_ENV) {
        return json!({ "path": lib.to_string_lossy(), "linked": true });
    }
    let found = probe();
    if found.nccl.is_ok() || found.cuda.is_err() {
        return json!({ "path": Value::Null, "linked": false });
    }
    let scratch = std::env::temp_dir().join("kt-gpu-check");
    match cuda::loader_path_for_nccl(&scratch) {
        Ok(Some((lib, ld_path))) => {
            let exe = match std::env::current_exe() {
                Ok(e) => e,
                Err(e) => return json!({ "error": format!("finding this binary: {e}") }),
            };
            let err = Command::new(exe)
                .args(std::env::args_os().skip(1))
                .env("LD_LIBRARY_PATH", ld_path)
                .env(REEXEC_ENV, OsString::from(lib.as_os_str()))
                .exec();
            json!({ "path": lib.to_string_lossy(), "error": format!("running again: {err}") })
        }
        Ok(None) => json!({ "path": Value::Null, "error": "no libnccl.so.2 found" }),
        Err(e) => json!({ "path": Value::Null, "error": format!("linking libnccl.so: {e}") }),
    }
}

struct Report {
    json: Value,
    code: i32,
}

/// One check's outcome, for the report.
fn outcome(name: &str, started: Instant, result: Result<Value, String>) -> (bool, Value) {
    let ms = child::ms(started.elapsed());
    match result {
        Ok(detail) => (
            true,
            json!({"name": name, "status": "ok", "ms": ms, "detail": detail}),
        ),
        Err(error) => (
            false,
            json!({"name": name, "status": "failed", "ms": ms, "error": error}),
        ),
    }
}

fn run_checks(opts: &Options, nccl_library: Value) -> Report {
    let found = probe();
    let reason = |r: &cuda::probe::Unavailable| r.0.clone();
    let probe_json = json!({
        "cuda": match &found.cuda {
            Ok(c) => json!({"ok": true, "devices": c.devices, "driver_version": c.driver_version}),
            Err(e) => json!({"ok": false, "reason": reason(e)}),
        },
        "nccl": match &found.nccl {
            Ok(n) => json!({"ok": true, "version": n.version_string()}),
            Err(e) => json!({"ok": false, "reason": reason(e)}),
        },
        "nccl_library": nccl_library,
    });
    let Ok(info) = &found.cuda else {
        return Report {
            json: json!({
                "tool": "kt-gpu-check",
                "status": "not_available",
                "reason": found.cuda.as_ref().err().map(reason),
                "probe": probe_json,
                "checks": [],
            }),
            code: 2,
        };
    };
    let mut checks = Vec::new();
    let mut all_ok = true;
    let mut record = |name: &str, f: &mut dyn FnMut() -> Result<Value, String>| {
        let started = Instant::now();
        let (ok, v) = outcome(name, started, f());
        all_ok &= ok;
        checks.push(v);
    };
    record("device_memory", &mut || device_memory(opts));
    record("cuda_ipc", &mut || cuda_ipc(opts));
    let nccl_ready = || {
        found
            .nccl
            .as_ref()
            .map(|_| ())
            .map_err(|e| format!("NCCL is not available: {}", e.0))
    };
    record("nccl_broadcast", &mut || {
        nccl_ready()?;
        nccl_broadcast(opts, info.devices, 2, 0)
    });
    // Three ranks in a chain (fanout 1): the middle one receives and passes on at once.
    record("nccl_tree", &mut || {
        nccl_ready()?;
        nccl_broadcast(opts, info.devices, 3, 1)
    });
    record("nccl_init_deadline", &mut || {
        nccl_ready()?;
        init_deadline(opts)
    });
    record("throughput", &mut || {
        nccl_ready()?;
        throughput(opts)
    });
    Report {
        json: json!({
            "tool": "kt-gpu-check",
            "status": if all_ok { "ok" } else { "failed" },
            "bytes": opts.bytes,
            "device": opts.device,
            "probe": probe_json,
            "checks": checks,
        }),
        code: if all_ok { 0 } else { 1 },
    }
}

fn text<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// `len` bytes of a pattern named by `seed` (blake3's extendable output).
pub(crate) fn pattern(seed: &str, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    blake3::Hasher::new()
        .update(seed.as_bytes())
        .finalize_xof()
        .fill(&mut out);
    out
}

pub(crate) fn digest(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// Host -> device -> host, and a device fill, verified by digest.
fn device_memory(opts: &Options) -> Result<Value, String> {
    let dev = Device::open(opts.device).map_err(text("opening the device"))?;
    let stream = Stream::new(&dev).map_err(text("a stream"))?;
    let buf = dev.alloc(opts.bytes).map_err(text("allocating"))?;
    let data = pattern("device-memory", opts.bytes);
    let started = Instant::now();
    stream
        .upload(buf.range(), &data)
        .map_err(text("uploading"))?;
    let up = started.elapsed();
    let mut back = vec![0u8; opts.bytes];
    let started = Instant::now();
    stream
        .download(buf.range(), &mut back)
        .map_err(text("downloading"))?;
    let down = started.elapsed();
    if digest(&back) != digest(&data) {
        return Err("the bytes read back differ from those written".into());
    }
    let tail = buf
        .range()
        .slice(opts.bytes / 2, opts.bytes - opts.bytes / 2);
    let tail = tail.map_err(text("a slice"))?;
    stream.fill(tail, 0).map_err(text("filling"))?;
    stream.synchronize().map_err(text("synchronizing"))?;
    stream
        .download(buf.range(), &mut back)
        .map_err(text("downloading"))?;
    let half = opts.bytes / 2;
    if back[..half] != data[..half] || back[half..].iter().any(|&b| b != 0) {
        return Err("a fill of the second half did not do just that".into());
    }
    Ok(json!({
        "upload_ms": child::ms(up),
        "download_ms": child::ms(down),
    }))
}

/// This process exports a range (at an offset inside its allocation); a child maps it, reads
/// it and writes another pattern into it.
fn cuda_ipc(opts: &Options) -> Result<Value, String> {
    const OFFSET: usize = 4096;
    let dev = Device::open(opts.device).map_err(text("opening the device"))?;
    let stream = Stream::new(&dev).map_err(text("a stream"))?;
    let buf = dev.alloc(opts.bytes + OFFSET).map_err(text("allocating"))?;
    let range = buf
        .range()
        .slice(OFFSET, opts.bytes)
        .map_err(text("a slice"))?;
    let data = pattern("ipc-parent", opts.bytes);
    stream.upload(range, &data).map_err(text("uploading"))?;
    let export = ipc::export(&dev, range).map_err(text("exporting"))?;
    if export.offset != OFFSET as u64 || export.len != opts.bytes as u64 {
        return Err(format!(
            "exported {export:?}, not the range at offset {OFFSET}"
        ));
    }
    let write_seed = "ipc-child";
    let args = child::ipc_args(opts.device, &export, write_seed);
    let answer = procs::spawn("ipc", &args, &[])?.wait(Instant::now() + Duration::from_secs(60))?;
    let read = answer.get("read_digest").and_then(Value::as_str);
    if read != Some(digest(&data).as_str()) {
        return Err(format!(
            "the child read other bytes than exported: {answer}"
        ));
    }
    let mut back = vec![0u8; opts.bytes];
    stream
        .download(range, &mut back)
        .map_err(text("downloading"))?;
    if digest(&back) != digest(&pattern(write_seed, opts.bytes)) {
        return Err("what the child wrote through its mapping is not here".into());
    }
    Ok(json!({ "child": answer, "offset": OFFSET }))
}

/// Two ranks in two child processes; rank 0 broadcasts a pattern, both must hold it.
/// `nranks` ranks (each on its own GPU where there are enough, else all on `--device` as
/// separate NCCL hosts) move `--bytes` from rank 0: by NCCL's broadcast (`fanout` 0) or down
/// the workers' pipelined tree of degree `fanout`; every rank's bytes are checked.
fn nccl_broadcast(
    opts: &Options,
    devices: u32,
    nranks: usize,
    fanout: usize,
) -> Result<Value, String> {
    let gpu_each = devices as usize >= nranks;
    let id = UniqueId::new().map_err(text("a unique id"))?;
    let seed = "nccl-broadcast";
    let timeout = Duration::from_secs(90);
    let mut running = Vec::new();
    for rank in 0..nranks {
        let device = if gpu_each { rank as i32 } else { opts.device };
        let args: Vec<String> = vec![
            rank.to_string(),
            nranks.to_string(),
            device.to_string(),
            id.to_hex(),
            opts.bytes.to_string(),
            seed.to_string(),
            timeout.as_millis().to_string(),
            fanout.to_string(),
        ];
        let envs: Vec<(&str, String)> = if gpu_each {
            Vec::new()
        } else {
            vec![
                ("NCCL_HOSTID", format!("kt-gpu-check-rank-{rank}")),
                ("NCCL_P2P_DISABLE", "1".into()),
                ("NCCL_SHM_DISABLE", "1".into()),
                ("NCCL_IB_DISABLE", "1".into()),
            ]
        };
        running.push(procs::spawn("nccl-rank", &args, &envs)?);
    }
    let deadline = Instant::now() + timeout + Duration::from_secs(30);
    // Wait for every rank even when one failed, so none outlives the check.
    let answers: Vec<Result<Value, String>> =
        running.into_iter().map(|r| r.wait(deadline)).collect();
    let want = digest(&pattern(seed, opts.bytes));
    let mut ranks = Vec::new();
    for answer in answers {
        let answer = answer?;
        if answer.get("digest").and_then(Value::as_str) != Some(want.as_str()) {
            return Err(format!(
                "a rank holds other bytes than the root's: {answer}"
            ));
        }
        ranks.push(answer);
    }
    Ok(json!({
        "mode": if gpu_each { "a_gpu_each" } else { "one_gpu_over_sockets" },
        "fanout": fanout,
        "ranks": ranks,
    }))
}

/// `--big-bytes` moved on one GPU twice: a plain device-to-device copy, and a broadcast of a
/// one-rank communicator from one buffer into another (NCCL's own copy path, its launch and
/// completion waits included); the second half of each destination is checked against its
/// source.
fn throughput(opts: &Options) -> Result<Value, String> {
    let n = opts.big_bytes;
    let dev = Device::open(opts.device).map_err(text("opening the device"))?;
    let stream = Stream::new(&dev).map_err(text("a stream"))?;
    let src = dev.alloc(n).map_err(text("allocating the source"))?;
    let dst = dev.alloc(n).map_err(text("allocating the destination"))?;
    let sample = n.min(64 << 20);
    let src_tail = src
        .range()
        .slice(n - sample, sample)
        .map_err(text("a slice"))?;
    let dst_tail = dst
        .range()
        .slice(n - sample, sample)
        .map_err(text("a slice"))?;
    let data = pattern("throughput", sample);
    stream.fill(src.range(), 0x5a).map_err(text("filling"))?;
    stream.upload(src_tail, &data).map_err(text("uploading"))?;
    let check = |what: &str| -> Result<(), String> {
        let mut back = vec![0u8; sample];
        stream
            .download(dst_tail, &mut back)
            .map_err(text("downloading"))?;
        if back != data {
            return Err(format!("the {what} left other bytes than its source's"));
        }
        stream.fill(dst.range(), 0).map_err(text("clearing"))?;
        stream.synchronize().map_err(text("synchronizing"))
    };
    // The first copy warms the path; the second is timed.
    let mut copy = Duration::ZERO;
    for _ in 0..2 {
        let started = Instant::now();
        stream
            .copy(dst.range(), src.range())
            .map_err(text("copying"))?;
        stream.synchronize().map_err(text("synchronizing"))?;
        copy = started.elapsed();
    }
    check("device-to-device copy")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let id = UniqueId::new().map_err(text("a unique id"))?;
    let comm = Comm::init(&id, 1, 0, &dev, deadline).map_err(text("a one-rank communicator"))?;
    let mut bcast = Duration::ZERO;
    for _ in 0..2 {
        let started = Instant::now();
        comm.broadcast(Some(src.range()), dst.range(), 0, &stream, deadline)
            .map_err(text("broadcasting"))?;
        comm.wait(&stream, deadline)
            .map_err(text("waiting for the broadcast"))?;
        bcast = started.elapsed();
    }
    check("one-rank broadcast")?;
    let rate = |d: Duration| n as f64 / d.as_secs_f64().max(1e-9) / 1e9;
    Ok(json!({
        "bytes": n,
        "d2d_copy_ms": child::ms(copy),
        "d2d_copy_gb_per_s": rate(copy),
        "nccl_one_rank_broadcast_ms": child::ms(bcast),
        "nccl_one_rank_broadcast_gb_per_s": rate(bcast),
        "broadcast_over_copy": bcast.as_secs_f64() / copy.as_secs_f64().max(1e-9),
    }))
}

/// A child joins a communicator of 2 that its peer never joins.
fn init_deadline(opts: &Options) -> Result<Value, String> {
    let deadline_ms = opts.abort_deadline.as_millis() as u64;
    let args = vec![opts.device.to_string(), deadline_ms.to_string()];
    let limit = Instant::now() + opts.abort_deadline + Duration::from_secs(60);
    let answer = procs::spawn("abort", &args, &[])?.wait(limit)?;
    let message = answer.get("message").and_then(Value::as_str).unwrap_or("");
    if !message.contains("did not finish within") || !message.contains("aborted") {
        return Err(format!("an unclear error: {message:?}"));
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_parse_and_refuse_what_they_must() {
        let o = Options::parse(&[]).unwrap();
        assert_eq!((o.bytes, o.device), (64 << 20, 0));
        let o = Options::parse(&args(&["--bytes", "1024", "--device", "1"])).unwrap();
        assert_eq!((o.bytes, o.device), (1024, 1));
        let o = Options::parse(&args(&["--big-bytes", "4096"])).unwrap();
        assert_eq!(o.big_bytes, 4096);
        let o = Options::parse(&args(&["--abort-deadline-ms", "250"])).unwrap();
        assert_eq!(o.abort_deadline, Duration::from_millis(250));
        for bad in [
            &["--bytes"][..],
            &["--bytes", "0"],
            &["--device", "-1"],
            &["--abort-deadline-ms", "x"],
            &["--frobnicate"],
        ] {
            assert!(Options::parse(&args(bad)).is_err(), "{bad:?}");
        }
        assert_eq!(
            Options::parse(&args(&["--help"])).err(),
            Some(String::new())
        );
    }

    #[test]
    fn patterns_are_deterministic_and_differ_by_seed() {
        assert_eq!(pattern("a", 100), pattern("a", 100));
        assert_ne!(pattern("a", 100), pattern("b", 100));
        assert_eq!(&pattern("a", 1000)[..100], &pattern("a", 100)[..]);
        assert_eq!(digest(b""), blake3::hash(b"").to_hex().to_string());
    }
}
