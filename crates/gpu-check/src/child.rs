//! What the check's child processes do (`kt-gpu-check --child MODE ...`): each prints one JSON
//! object on stdout, `{"error": ...}` with exit status 1 when it failed.
//!
//! - `ipc DEVICE HANDLE OFFSET LEN WRITE_SEED`: maps the parent's exported memory, copies it
//!   into memory of its own and back to the host (the digest of what it read), then writes the
//!   pattern of `WRITE_SEED` into the parent's memory through the mapping;
//! - `nccl-rank RANK NRANKS DEVICE ID LEN SEED TIMEOUT_MS`: one rank of the broadcast (rank 0 the
//!   root, holding the pattern of `SEED`), the digest of what it holds afterwards;
//! - `abort DEVICE DEADLINE_MS`: rank 0 of a communicator of 2 whose rank 1 never comes; the
//!   init deadline must fire and say so, and the process must still make a working
//!   communicator afterwards (1 rank).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ktfs::gpu::cuda::{ipc, Comm, Device, IpcMapping, NcclError, Stream, UniqueId};
use ktfs::gpu::worker::collective;
use serde_json::{json, Value};

use crate::{digest, pattern};

/// Runs the child mode `args[0]`; the exit status.
pub fn run(args: &[String]) -> i32 {
    let (mode, rest) = match args.split_first() {
        Some((m, r)) => (m.as_str(), r),
        None => ("", &[][..]),
    };
    let result = match mode {
        "ipc" => ipc_child(rest),
        "nccl-rank" => nccl_rank(rest),
        "abort" => abort_child(rest),
        other => Err(format!("unknown child mode {other:?}")),
    };
    let (line, code) = match result {
        Ok(v) => (v, 0),
        Err(e) => (json!({ "error": e }), 1),
    };
    println!("{line}");
    code
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, name: &str) -> Result<T, String> {
    args.get(i)
        .ok_or_else(|| format!("missing {name}"))?
        .parse()
        .map_err(|_| format!("{name} {:?} is not valid", args[i]))
}

fn text<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

fn ipc_child(args: &[String]) -> Result<Value, String> {
    let device: i32 = arg(args, 0, "device")?;
    let handle_hex: String = arg(args, 1, "handle")?;
    let offset: u64 = arg(args, 2, "offset")?;
    let len: usize = arg(args, 3, "length")?;
    let write_seed: String = arg(args, 4, "write seed")?;
    let handle: [u8; 64] = hex_bytes(&handle_hex)?
        .try_into()
        .map_err(|_| "an IPC handle is 64 bytes".to_string())?;

    let dev = Device::open(device).map_err(text("opening the device"))?;
    let started = Instant::now();
    let mapping = IpcMapping::open(&dev, &handle, offset, len as u64)
        .map_err(text("opening the IPC handle"))?;
    let open_ms = ms(started.elapsed());
    let stream = Stream::new(&dev).map_err(text("a stream"))?;
    let own = dev.alloc(len).map_err(text("allocating"))?;

    // Peer memory -> own memory -> host: what the parent wrote.
    let started = Instant::now();
    stream
        .copy(own.range(), mapping.range())
        .map_err(text("copying from the mapping"))?;
    stream.synchronize().map_err(text("synchronizing"))?;
    let copy_ms = ms(started.elapsed());
    let mut host = vec![0u8; len];
    stream
        .download(own.range(), &mut host)
        .map_err(text("downloading"))?;
    let read_digest = digest(&host);

    // Host -> own memory -> peer memory: what the parent will read back.
    stream
        .upload(own.range(), &pattern(&write_seed, len))
        .map_err(text("uploading"))?;
    stream
        .copy(mapping.range(), own.range())
        .map_err(text("copying into the mapping"))?;
    stream.synchronize().map_err(text("synchronizing"))?;
    Ok(json!({
        "read_digest": read_digest,
        "allocation_size": mapping.allocation_size(),
        "open_ms": open_ms,
        "copy_ms": copy_ms,
    }))
}

fn nccl_rank(args: &[String]) -> Result<Value, String> {
    let rank: usize = arg(args, 0, "rank")?;
    let nranks: usize = arg(args, 1, "nranks")?;
    let device: i32 = arg(args, 2, "device")?;
    let id_hex: String = arg(args, 3, "unique id")?;
    let len: usize = arg(args, 4, "length")?;
    let seed: String = arg(args, 5, "seed")?;
    let timeout = Duration::from_millis(arg(args, 6, "timeout")?);
    // 0 or absent: NCCL's broadcast; else the workers' pipelined tree of that degree.
    let fanout: usize = if args.len() > 7 {
        arg(args, 7, "fanout")?
    } else {
        0
    };
    let id = UniqueId::from_hex(&id_hex).map_err(text("the unique id"))?;

    let dev = Device::open(device).map_err(text("opening the device"))?;
    let stream = Stream::new(&dev).map_err(text("a stream"))?;
    let buf = dev.alloc(len).map_err(text("allocating"))?;
    if rank == 0 {
        stream
            .upload(buf.range(), &pattern(&seed, len))
            .map_err(text("uploading"))?;
    } else {
        stream.fill(buf.range(), 0xa5).map_err(text("filling"))?;
        stream.synchronize().map_err(text("synchronizing"))?;
    }
    let started = Instant::now();
    let comm = Comm::init(&id, nranks, rank, &dev, started + timeout)
        .map_err(text("joining the communicator"))?;
    let init_ms = ms(started.elapsed());
    let started = Instant::now();
    let deadline = started + timeout;
    if fanout == 0 {
        comm.broadcast(None, buf.range(), 0, &stream, deadline)
            .map_err(text("broadcasting"))?;
    } else {
        let place = collective::tree_place(rank, 0, nranks, fanout);
        collective::tree_unit(&comm, buf.range(), &place, &stream, deadline)
            .map_err(text("sending down the tree"))?;
    }
    comm.wait(&stream, deadline)
        .map_err(text("waiting for the broadcast"))?;
    let elapsed = started.elapsed();
    let mut host = vec![0u8; len];
    stream
        .download(buf.range(), &mut host)
        .map_err(text("downloading"))?;
    drop(comm);
    Ok(json!({
        "rank": rank,
        "device": device,
        "digest": digest(&host),
        "init_ms": init_ms,
        "broadcast_ms": ms(elapsed),
        "gb_per_s": len as f64 / elapsed.as_secs_f64().max(1e-9) / 1e9,
    }))
}

fn abort_child(args: &[String]) -> Result<Value, String> {
    let device: i32 = arg(args, 0, "device")?;
    let deadline_ms: u64 = arg(args, 1, "deadline")?;
    let wanted = Duration::from_millis(deadline_ms);
    let dev = Device::open(device).map_err(text("opening the device"))?;
    let id = UniqueId::new().map_err(text("a unique id"))?;
    let started = Instant::now();
    let outcome = Comm::init(&id, 2, 0, &dev, started + wanted);
    let returned = started.elapsed();
    let message = match outcome {
        Ok(_) => return Err("a communicator of 2 was made with one rank only".into()),
        Err(e @ NcclError::Timeout { .. }) => e.to_string(),
        Err(e) => return Err(format!("init failed, but not by its deadline: {e}")),
    };
    if returned < wanted {
        return Err(format!(
            "the deadline fired early, after {returned:?}: {message}"
        ));
    }
    if returned > wanted + Duration::from_secs(20) {
        return Err(format!(
            "init returned {returned:?} after a deadline of {wanted:?}: the abort was slow"
        ));
    }
    let after = single_rank(&dev).map_err(text("a 1-rank communicator after the abort"))?;
    Ok(json!({
        "message": message,
        "deadline_ms": deadline_ms,
        "returned_after_ms": ms(returned),
        "single_rank_after_abort": after,
    }))
}

/// A 1-rank communicator broadcasting 1 MiB in place: NCCL still works in this process.
fn single_rank(dev: &Arc<Device>) -> Result<Value, String> {
    let len = 1 << 20;
    let deadline = Instant::now() + Duration::from_secs(30);
    let id = UniqueId::new().map_err(text("a unique id"))?;
    let stream = Stream::new(dev).map_err(text("a stream"))?;
    let buf = dev.alloc(len).map_err(text("allocating"))?;
    let data = pattern("single-rank", len);
    stream
        .upload(buf.range(), &data)
        .map_err(text("uploading"))?;
    let comm = Comm::init(&id, 1, 0, dev, deadline).map_err(text("init"))?;
    comm.broadcast(None, buf.range(), 0, &stream, deadline)
        .map_err(text("broadcast"))?;
    comm.wait(&stream, deadline).map_err(text("wait"))?;
    let mut host = vec![0u8; len];
    stream
        .download(buf.range(), &mut host)
        .map_err(text("downloading"))?;
    if digest(&host) != digest(&data) {
        return Err("a 1-rank broadcast changed its buffer".into());
    }
    Ok(json!("ok"))
}

/// `ms` with a fraction, for the report.
pub fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

pub fn hex_bytes(hex: &str) -> Result<Vec<u8>, String> {
    if !hex.len().is_multiple_of(2) || !hex.is_ascii() {
        return Err(format!("{hex:?} is not hex"));
    }
    (0..hex.len() / 2)
        .map(|i| {
            u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .map_err(|_| format!("{hex:?} is not hex"))
        })
        .collect()
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The IPC export as the `ipc` child's arguments take it.
pub fn ipc_args(device: i32, export: &ipc::IpcExport, write_seed: &str) -> Vec<String> {
    vec![
        device.to_string(),
        to_hex(&export.handle),
        export.offset.to_string(),
        export.len.to_string(),
        write_seed.to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(hex_bytes(&to_hex(&bytes)).unwrap(), bytes);
        assert!(hex_bytes("abc").is_err());
        assert!(hex_bytes("zz").is_err());
        assert!(hex_bytes("éé").is_err());
    }

    #[test]
    fn an_unknown_mode_or_missing_arguments_fail_cleanly() {
        assert_eq!(run(&["nope".into()]), 1);
        assert_eq!(run(&[]), 1);
        assert_eq!(run(&["ipc".into()]), 1);
        assert_eq!(run(&["nccl-rank".into(), "x".into()]), 1);
    }
}
