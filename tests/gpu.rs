//! GPU control files for real: a store server and two mounts (two nodes), a publisher that
//! registers a state dict of mixed dtypes in host memory through `/kt/.gpu` on one, a getter
//! that receives it into its own buffers through the other (the transfer workers started by
//! each node's agent, the bytes over the host transport), every call through the kernel's
//! ioctl and poll(2). These tests need /dev/fuse and root; they never skip themselves.

mod common;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use ktfs::gpu::abi::*;

const DTYPES: [(&str, u64); 5] = [
    ("float32", 4),
    ("bfloat16", 2),
    ("int64", 8),
    ("uint8", 1),
    ("float16", 2),
];

/// A table of `n` entries of mixed dtypes and shapes, and each entry's size.
fn table(n: usize) -> (String, Vec<u64>) {
    let mut entries = Vec::new();
    let mut sizes = Vec::new();
    for i in 0..n {
        let (dtype, size) = DTYPES[i % DTYPES.len()];
        let shape = [1 + (i as u64 * 37) % 61, 1 + (i as u64 * 11) % 23];
        entries.push(
            serde_json::json!({"name": format!("layer{i}.weight"), "dtype": dtype, "shape": shape}),
        );
        sizes.push(shape[0] * shape[1] * size);
    }
    (serde_json::json!({ "entries": entries }).to_string(), sizes)
}

/// A file in /dev/shm, removed when dropped.
struct Shm(PathBuf);

impl Shm {
    fn new(tag: &str, data: &[u8]) -> Shm {
        let p = PathBuf::from(format!("/dev/shm/kt-test-{}-{tag}", std::process::id()));
        std::fs::write(&p, data).unwrap();
        Shm(p)
    }

    fn name(&self) -> String {
        self.0.file_name().unwrap().to_string_lossy().into_owned()
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn open(path: &Path, create: bool) -> OwnedFd {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // Close-on-exec: a process another test spawns meanwhile must not inherit the descriptor,
    // and with it the registration, which lives until its last copy is closed.
    let flags = libc::O_RDWR | libc::O_CLOEXEC | if create { libc::O_CREAT } else { 0 };
    // SAFETY: a valid C string; the descriptor is owned from here on.
    let fd = unsafe { libc::open(c.as_ptr(), flags, 0o644) };
    assert!(
        fd >= 0,
        "open {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn write_all(fd: &OwnedFd, data: &[u8]) {
    // SAFETY: a valid buffer of its length.
    let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
    assert_eq!(
        n as usize,
        data.len(),
        "{}",
        std::io::Error::last_os_error()
    );
}

/// An ioctl's return value, or its errno.
fn ioctl<T>(fd: &OwnedFd, cmd: u32, arg: &mut T) -> Result<i32, i32> {
    // SAFETY: `arg` is a struct of the size `cmd` encodes, valid for reads and writes.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), cmd as _, arg as *mut T) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}

/// Buffers for every entry of `sizes`, laid out one after the other in the shm file `shm`.
fn buffers(shm: &Shm, sizes: &[u64], kind: u32) -> KtGpuBuffers {
    let empty = KtGpuBuffer {
        kind: 0,
        device: 0,
        entry: 0,
        reserved: 0,
        offset: 0,
        nbytes: 0,
        handle: [0; 64],
    };
    let mut b = KtGpuBuffers {
        version: ABI_VERSION,
        flags: COMMIT,
        count: sizes.len() as u32,
        reserved: 0,
        buffers: [empty; BATCH],
    };
    let mut handle = [0u8; 64];
    handle[..shm.name().len()].copy_from_slice(shm.name().as_bytes());
    let mut at = 0;
    for (i, &n) in sizes.iter().enumerate() {
        b.buffers[i] = KtGpuBuffer {
            kind,
            device: -1,
            entry: i as u32,
            reserved: 0,
            offset: at,
            nbytes: n,
            handle,
        };
        at += n;
    }
    b
}

/// Publishes `src` (entries of `sizes`) under the table `json` at `path`, waiting until done;
/// the control file that keeps it published.
fn publish(path: &Path, json: &str, src: &Shm, sizes: &[u64]) -> OwnedFd {
    let put = open(path, true);
    write_all(&put, json.as_bytes());
    let t = ioctl(&put, KT_GPU_PUT, &mut buffers(src, sizes, BUF_HOST_SHM)).expect("PUT");
    let st = finished(&put, t);
    assert_eq!(st.state, DONE, "{}", message(&st));
    put
}

/// Waits in poll(2) for the control file to become readable (its transfer finished).
fn wait_readable(fd: &OwnedFd, limit: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, limit.as_millis() as i32) };
    n == 1 && p.revents & libc::POLLIN != 0
}

/// The status of `transfer` once poll(2) says it finished.
fn finished(fd: &OwnedFd, transfer: i32) -> KtGpuStatus {
    assert!(
        wait_readable(fd, Duration::from_secs(60)),
        "transfer {transfer} never finished"
    );
    status(fd, transfer)
}

fn status(fd: &OwnedFd, transfer: i32) -> KtGpuStatus {
    let mut st = KtGpuStatus {
        transfer: transfer as u64,
        state: 0,
        error: 0,
        bytes_done: 0,
        bytes_total: 0,
        message: [0; 256],
    };
    ioctl(fd, KT_GPU_STATUS, &mut st).expect("STATUS");
    st
}

fn message(st: &KtGpuStatus) -> String {
    text(&st.message, "message").unwrap_or("").to_string()
}

#[test]
fn a_state_dict_goes_from_one_nodes_buffers_into_anothers() {
    let c = Cluster::new("127.0.0.150");
    let a = start_mount("127.0.0.150", &c.server.addr, &c.path("a"), "gpu-a", &[]);
    let b = start_mount("127.0.0.151", &c.server.addr, &c.path("b"), "gpu-b", &[]);
    let (json, sizes) = table(50);
    let total: u64 = sizes.iter().sum();
    let data = pseudo_random(total as usize, 5);
    let src = Shm::new("src", &data);

    // Publish: the table, then the buffers, committed; the key is there once STATUS says done.
    std::fs::create_dir_all(a.path(".gpu/model")).unwrap();
    let put = open(&a.path(".gpu/model/sd"), true);
    write_all(&put, json.as_bytes());
    let t = ioctl(&put, KT_GPU_PUT, &mut buffers(&src, &sizes, BUF_HOST_SHM)).expect("PUT");
    assert!(t > 0);
    let st = finished(&put, t);
    assert_eq!(st.state, DONE, "{}", message(&st));
    assert_eq!(st.bytes_total, total);

    // Every node sees it: in its control tree, as JSON, and in `kt ls` with its publisher.
    let names = std::fs::read_dir(b.path(".gpu/model"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect::<Vec<_>>();
    assert_eq!(names, ["sd"]);
    let desc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.path(".gpu/model/sd")).unwrap()).unwrap();
    assert_eq!(desc["entries"].as_array().unwrap().len(), 50);
    assert_eq!(desc["entries"][1]["dtype"], "bfloat16");
    assert_eq!(desc["nbytes"], total);
    assert_eq!(desc["publisher"], "gpu-a");
    let ls = c.json(None, &["ls", "model"]);
    assert_eq!(ls[0]["name"], "sd");
    assert_eq!(ls[0]["locale"], "gpu-a");
    // No file takes a GPU key's name: its publish, at fsync, is refused.
    let mut f = std::fs::File::create(b.path("model/sd")).unwrap();
    std::io::Write::write_all(&mut f, b"x").unwrap();
    assert_eq!(f.sync_all().unwrap_err().raw_os_error(), Some(libc::EEXIST));
    drop(f);

    // Receive into buffers of the getter's own, through the other node.
    let dst = Shm::new("dst", &vec![0u8; total as usize]);
    let get = open(&b.path(".gpu/model/sd"), false);
    write_all(&get, json.as_bytes());
    let g = ioctl(&get, KT_GPU_GET, &mut buffers(&dst, &sizes, BUF_HOST_SHM)).expect("GET");
    assert!(
        wait_readable(&get, Duration::from_secs(30)),
        "the GET never finished"
    );
    let st = status(&get, g);
    assert_eq!(st.state, DONE, "{}", message(&st));
    assert_eq!((st.bytes_done, st.bytes_total), (total, total));
    assert!(
        std::fs::read(&dst.0).unwrap() == data,
        "the received bytes differ"
    );

    // A getter whose table differs fails, saying where, and no byte moves.
    let (other, other_sizes) = table(49);
    let wrong = Shm::new(
        "wrong",
        &vec![0u8; other_sizes.iter().sum::<u64>() as usize],
    );
    let bad = open(&b.path(".gpu/model/sd"), false);
    write_all(&bad, other.as_bytes());
    let w = ioctl(
        &bad,
        KT_GPU_GET,
        &mut buffers(&wrong, &other_sizes, BUF_HOST_SHM),
    )
    .unwrap();
    let st = finished(&bad, w);
    assert_eq!(
        (st.state, st.error),
        (FAILED, libc::EBADMSG),
        "{}",
        message(&st)
    );
    assert!(message(&st).contains("publisher"), "{}", message(&st));
    drop(bad);

    // Closing the publisher's control file unpublishes the key (the getter's, still open,
    // keeps only its own view of the name on its node).
    drop(put);
    assert!(
        eventually(Duration::from_secs(10), || {
            c.kt(None, &["ls", "model"]).status.code() == Some(3)
        }),
        "the key outlived its publisher's registration"
    );
    assert!(eventually(Duration::from_secs(10), || {
        std::fs::read_dir(a.path(".gpu/model")).is_ok_and(|d| d.count() == 0)
    }));
    drop(get);
    assert!(eventually(Duration::from_secs(10), || {
        std::fs::read_dir(b.path(".gpu")).is_ok_and(|d| d.count() == 0)
    }));
}

#[test]
fn bad_calls_get_their_errno_and_cuda_buffers_say_there_is_no_gpu() {
    let c = Cluster::new("127.0.0.152");
    let a = start_mount("127.0.0.152", &c.server.addr, &c.path("a"), "gpu-c", &[]);
    let (json, sizes) = table(3);
    let src = Shm::new("bad-src", &vec![1u8; sizes.iter().sum::<u64>() as usize]);
    let fd = open(&a.path(".gpu/errs"), true);

    // A struct of another size is another command: EINVAL. Another driver's ioctl: ENOTTY.
    let mut small = [0u8; 100];
    let other = (1u32 << 30) | (100 << 16) | ((MAGIC as u32) << 8) | 1;
    assert_eq!(ioctl(&fd, other, &mut small), Err(libc::EINVAL));
    assert_eq!(ioctl(&fd, 0x5401, &mut small), Err(libc::ENOTTY));
    // A bad version, and buffers that do not cover the table.
    let mut b = buffers(&src, &sizes, BUF_HOST_SHM);
    b.version = 9;
    assert_eq!(ioctl(&fd, KT_GPU_PUT, &mut b), Err(libc::EINVAL));
    write_all(&fd, json.as_bytes());
    let mut b = buffers(&src, &sizes, BUF_HOST_SHM);
    b.count = 2;
    assert_eq!(ioctl(&fd, KT_GPU_PUT, &mut b), Err(libc::EINVAL));
    drop(fd);

    // CUDA buffers on a machine with no GPU: a clear failure, not a panic.
    let fd = open(&a.path(".gpu/cuda"), true);
    write_all(&fd, json.as_bytes());
    let t = ioctl(&fd, KT_GPU_PUT, &mut buffers(&src, &sizes, BUF_CUDA_IPC)).unwrap();
    let st = finished(&fd, t);
    assert_eq!(
        (st.state, st.error),
        (FAILED, libc::ENODEV),
        "{}",
        message(&st)
    );
    assert!(message(&st).contains("GPU"), "{}", message(&st));
    // Nothing was published (the control files went when the kernel released them), and the
    // agent kept serving.
    drop(fd);
    assert!(eventually(Duration::from_secs(10), || {
        std::fs::read_dir(a.path(".gpu")).is_ok_and(|d| d.count() == 0)
    }));
    let start = Instant::now();
    std::fs::write(a.path("plain.txt"), b"still a filesystem").unwrap();
    assert!(start.elapsed() < Duration::from_secs(10));
}

/// The pid of the transfer worker that `parent` (a mount's process) started.
fn worker_of(parent: u32) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let ppid: u32 = stat
            .rsplit(')')
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (ppid == parent && String::from_utf8_lossy(&cmd).contains("gpu-worker")).then_some(pid)
    })
}

#[test]
fn many_getters_wait_in_poll_while_the_mount_serves_everyone_else() {
    let c = Cluster::new("127.0.0.153");
    let a = start_mount("127.0.0.153", &c.server.addr, &c.path("a"), "gpu-p", &[]);
    let b = start_mount("127.0.0.154", &c.server.addr, &c.path("b"), "gpu-q", &[]);
    let (json, sizes) = table(4);
    let total: u64 = sizes.iter().sum();
    let data = pseudo_random(total as usize, 9);
    let src = Shm::new("poll-src", &data);
    let _put = publish(&a.path(".gpu/w"), &json, &src, &sizes);

    // The publisher's worker stops answering: every GET waits on it, none of them in the mount.
    let worker = worker_of(a.proc.as_ref().unwrap().pid()).expect("the publisher's worker");
    signal(worker, libc::SIGSTOP);
    const GETTERS: usize = 16;
    let mut getters = Vec::new();
    for i in 0..GETTERS {
        let dst = Shm::new(&format!("poll-dst-{i}"), &vec![0u8; total as usize]);
        let fd = open(&b.path(".gpu/w"), false);
        write_all(&fd, json.as_bytes());
        let start = Instant::now();
        let id = ioctl(&fd, KT_GPU_GET, &mut buffers(&dst, &sizes, BUF_HOST_SHM)).unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "a GET ioctl waited for its transfer"
        );
        getters.push((fd, id, dst));
    }
    let mut fds: Vec<libc::pollfd> = getters
        .iter()
        .map(|(fd, _, _)| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: valid pollfds.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, 300) };
    assert_eq!(ready, 0, "a transfer finished with its source stopped");
    // With 16 transfers waiting (twice the mount's FUSE threads), the mount serves as ever.
    let start = Instant::now();
    std::fs::write(b.path("meanwhile.txt"), b"served").unwrap();
    assert_eq!(std::fs::read(b.path("meanwhile.txt")).unwrap(), b"served");
    assert!(std::fs::read_dir(b.path(".gpu")).unwrap().count() >= 1);
    assert!(start.elapsed() < Duration::from_secs(10));

    signal(worker, libc::SIGCONT);
    for (fd, id, dst) in &getters {
        assert!(
            wait_readable(fd, Duration::from_secs(30)),
            "a getter was never woken"
        );
        let st = status(fd, *id);
        assert_eq!(st.state, DONE, "{}", message(&st));
        assert!(std::fs::read(&dst.0).unwrap() == data);
    }
}

/// A window to JOIN: quorum at `world_size` members or after `timeout_ms`, a tree of `fanout`
/// (0: a chain), and `flags` (PACK, PG_GLOBAL).
fn window(group: &str, world_size: u32, timeout_ms: u64, fanout: u32, flags: u32) -> KtGpuWindow {
    let mut w = KtGpuWindow {
        version: ABI_VERSION,
        world_size,
        timeout_ms,
        fanout,
        flags,
        group_id: [0; 128],
        ips: [0; 1024],
    };
    w.group_id[..group.len()].copy_from_slice(group.as_bytes());
    w
}

/// A member of a window: its control file, its transfer and its buffers.
struct Member {
    fd: OwnedFd,
    transfer: i32,
    shm: Shm,
}

impl Member {
    /// Opens `path`, writes `json`, joins `w` and starts a PUT (of `data`) or a GET (into
    /// zeroed buffers) of entries of `sizes`.
    fn start(
        path: &Path,
        json: &str,
        sizes: &[u64],
        w: &KtGpuWindow,
        data: Option<&[u8]>,
    ) -> Member {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let total = sizes.iter().sum::<u64>() as usize;
        let shm = match data {
            Some(d) => Shm::new(&format!("win-{n}"), d),
            None => Shm::new(&format!("win-{n}"), &vec![0u8; total]),
        };
        // Getters may come before the putter: they open (creating the name on their node) and
        // wait in the window.
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let fd = open(path, true);
        write_all(&fd, json.as_bytes());
        ioctl(&fd, KT_GPU_JOIN, &mut w.clone()).expect("JOIN");
        let cmd = if data.is_some() {
            KT_GPU_PUT
        } else {
            KT_GPU_GET
        };
        let transfer = ioctl(&fd, cmd, &mut buffers(&shm, sizes, BUF_HOST_SHM)).expect("PUT/GET");
        Member { fd, transfer, shm }
    }

    /// The transfer's state, error and message once it finished.
    fn outcome(&self) -> (u32, i32, String) {
        let st = finished(&self.fd, self.transfer);
        (st.state, st.error, message(&st))
    }

    fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.shm.0).unwrap()
    }
}

#[test]
fn a_window_broadcasts_a_state_dict_to_every_getter_packed_or_not() {
    let c = Cluster::new("127.0.0.155");
    let a = start_mount("127.0.0.155", &c.server.addr, &c.path("a"), "gpw-a", &[]);
    let b = start_mount("127.0.0.156", &c.server.addr, &c.path("b"), "gpw-b", &[]);
    let d = start_mount("127.0.0.157", &c.server.addr, &c.path("d"), "gpw-d", &[]);
    let (json, sizes) = table(50);
    let total: u64 = sizes.iter().sum();
    let data = pseudo_random(total as usize, 21);

    // Quorum by world size: one putter and three getters on three nodes, a tree of fanout 2,
    // the bytes packed into one run. The getters join first: they wait for the putter.
    let w = window("packed", 4, 0, 2, PACK);
    let getters = [
        Member::start(&b.path(".gpu/sd/packed"), &json, &sizes, &w, None),
        Member::start(&d.path(".gpu/sd/packed"), &json, &sizes, &w, None),
        Member::start(&d.path(".gpu/sd/packed"), &json, &sizes, &w, None),
    ];
    // No putter yet: nobody finishes.
    let mut fds: Vec<libc::pollfd> = getters
        .iter()
        .map(|m| libc::pollfd {
            fd: m.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: valid pollfds.
    assert_eq!(unsafe { libc::poll(fds.as_mut_ptr(), 3, 200) }, 0);
    let putter = Member::start(&a.path(".gpu/sd/packed"), &json, &sizes, &w, Some(&data));
    for g in &getters {
        let (state, _, msg) = g.outcome();
        assert_eq!(state, DONE, "{msg}");
        assert!(
            g.bytes() == data,
            "a getter's bytes differ from the putter's"
        );
    }
    let (state, _, msg) = putter.outcome();
    assert_eq!(state, DONE, "{msg}");
    assert_eq!(status(&putter.fd, putter.transfer).bytes_total, total);

    // Quorum by timeout, unpacked (entry by entry), a chain: whoever joined in 1.5 s.
    let w = window("plain", 0, 1_500, 0, 0);
    let putter = Member::start(&a.path(".gpu/sd/plain"), &json, &sizes, &w, Some(&data));
    let getters = [
        Member::start(&d.path(".gpu/sd/plain"), &json, &sizes, &w, None),
        Member::start(&b.path(".gpu/sd/plain"), &json, &sizes, &w, None),
    ];
    for g in &getters {
        let (state, _, msg) = g.outcome();
        assert_eq!(state, DONE, "{msg}");
        assert!(
            g.bytes() == data,
            "a getter's bytes differ from the putter's"
        );
    }
    assert_eq!(putter.outcome().0, DONE);
    // That window is over: a getter that comes now opens the group's next one, where no one
    // puts, and is told so when its timeout closes it.
    let late = Member::start(&b.path(".gpu/sd/plain"), &json, &sizes, &w, None);
    let (state, errno, msg) = late.outcome();
    assert_eq!((state, errno), (FAILED, libc::ETIMEDOUT), "{msg}");
    assert!(msg.contains("no one put"), "{msg}");
}

#[test]
fn a_window_fails_as_a_whole_and_names_the_member_at_fault() {
    let c = Cluster::new("127.0.0.158");
    let a = start_mount("127.0.0.158", &c.server.addr, &c.path("a"), "gpf-a", &[]);
    let b = start_mount("127.0.0.159", &c.server.addr, &c.path("b"), "gpf-b", &[]);
    let d = start_mount("127.0.0.160", &c.server.addr, &c.path("d"), "gpf-d", &[]);
    let (json, sizes) = table(12);
    let total: u64 = sizes.iter().sum();
    let data = pseudo_random(total as usize, 22);

    // One getter's table differs: every member fails with EBADMSG, the mismatch named, and no
    // getter is sent a byte.
    let (other, other_sizes) = table(11);
    let w = window("mismatch", 3, 0, 0, 0);
    let putter = Member::start(&a.path(".gpu/bad"), &json, &sizes, &w, Some(&data));
    let good = Member::start(&b.path(".gpu/bad"), &json, &sizes, &w, None);
    let wrong = Member::start(&d.path(".gpu/bad"), &other, &other_sizes, &w, None);
    for m in [&putter, &good, &wrong] {
        let (state, errno, msg) = m.outcome();
        assert_eq!((state, errno), (FAILED, libc::EBADMSG), "{msg}");
        assert!(
            msg.contains("gpf-d"),
            "the message does not name the member: {msg}"
        );
    }
    assert!(good.bytes().iter().all(|&x| x == 0));
    let (_, _, msg) = wrong.outcome();
    assert!(
        msg.contains("entries"),
        "no detail of the difference: {msg}"
    );
    drop((putter, good, wrong));
    // The first part's worker on `a` exits with its last registration; until it has, the
    // search below could find it instead of the chain putter's own, and stop the wrong one.
    assert!(
        eventually(Duration::from_secs(20), || {
            worker_of(a.proc.as_ref().unwrap().pid()).is_none()
        }),
        "the first part's worker on a outlived its registrations"
    );

    // A chain putter -> b -> d -> d. With the putter's worker stopped, b closes its control
    // file mid-transfer: its children fail naming it, and so does the putter.
    let w = window("closed", 4, 0, 0, 0);
    let putter = Member::start(&a.path(".gpu/chain"), &json, &sizes, &w, Some(&data));
    let mut worker = None;
    assert!(
        eventually(Duration::from_secs(20), || {
            worker = worker_of(a.proc.as_ref().unwrap().pid());
            worker.is_some()
        }),
        "the putter's worker never started"
    );
    let worker = worker.unwrap();
    // Published: the worker has taken the putter's buffers, and may stop now.
    assert!(eventually(Duration::from_secs(20), || {
        c.kt(None, &["ls", "chain"]).status.success()
    }));
    signal(worker, libc::SIGSTOP);
    let first = Member::start(&b.path(".gpu/chain"), &json, &sizes, &w, None);
    let second = Member::start(&d.path(".gpu/chain"), &json, &sizes, &w, None);
    let third = Member::start(&d.path(".gpu/chain"), &json, &sizes, &w, None);
    // The plan is out once the first is running.
    assert!(eventually(Duration::from_secs(20), || {
        status(&first.fd, first.transfer).state == RUNNING
    }));
    drop(first);
    for m in [&second, &third] {
        let (state, errno, msg) = m.outcome();
        assert_eq!(state, FAILED, "{msg}");
        assert_eq!(errno, libc::ECONNABORTED, "{msg}");
        assert!(
            msg.contains("gpf-"),
            "the message does not name a member: {msg}"
        );
    }
    let (_, _, msg) = second.outcome();
    assert!(
        msg.contains("gpf-b"),
        "the child does not name its parent: {msg}"
    );
    signal(worker, libc::SIGCONT);
    let (state, _, msg) = putter.outcome();
    assert_eq!(state, FAILED, "{msg}");
    assert!(
        msg.contains("gpf-b"),
        "the putter does not name the getter: {msg}"
    );
}

#[test]
fn a_window_of_several_putters_and_keys_fills_each_getter_from_its_keys_putter() {
    let c = Cluster::new("127.0.0.64");
    let a = start_mount("127.0.0.64", &c.server.addr, &c.path("a"), "gpm-a", &[]);
    let b = start_mount("127.0.0.65", &c.server.addr, &c.path("b"), "gpm-b", &[]);
    let d = start_mount("127.0.0.66", &c.server.addr, &c.path("d"), "gpm-d", &[]);
    // Two shards of a sharded trainer, of different tables, put by ranks on nodes a and b; two
    // consumer ranks on b and d each get the other node's shard; a third gets shard 0 too.
    let (json0, sizes0) = table(20);
    let (json1, sizes1) = table(7);
    let data0 = pseudo_random(sizes0.iter().sum::<u64>() as usize, 31);
    let data1 = pseudo_random(sizes1.iter().sum::<u64>() as usize, 32);
    let w = window("shards", 5, 0, 0, PACK);
    let getters = [
        Member::start(&d.path(".gpu/tp/shard-0"), &json0, &sizes0, &w, None),
        Member::start(&b.path(".gpu/tp/shard-0"), &json0, &sizes0, &w, None),
    ];
    let put0 = Member::start(
        &a.path(".gpu/tp/shard-0"),
        &json0,
        &sizes0,
        &w,
        Some(&data0),
    );
    let put1 = Member::start(
        &b.path(".gpu/tp/shard-1"),
        &json1,
        &sizes1,
        &w,
        Some(&data1),
    );
    let got1 = Member::start(&a.path(".gpu/tp/shard-1"), &json1, &sizes1, &w, None);
    for g in &getters {
        let (state, _, msg) = g.outcome();
        assert_eq!(state, DONE, "{msg}");
        assert!(g.bytes() == data0, "a getter of shard 0 has other bytes");
    }
    let (state, _, msg) = got1.outcome();
    assert_eq!(state, DONE, "{msg}");
    assert!(
        got1.bytes() == data1,
        "the getter of shard 1 has other bytes"
    );
    for p in [&put0, &put1] {
        let (state, _, msg) = p.outcome();
        assert_eq!(state, DONE, "{msg}");
    }
    drop((getters, got1, put0, put1));

    // A getter of a key no member puts fails the window for every member, naming the key.
    let w = window("orphan", 3, 0, 0, 0);
    let members = [
        Member::start(&a.path(".gpu/tp/o-0"), &json0, &sizes0, &w, Some(&data0)),
        Member::start(&b.path(".gpu/tp/o-0"), &json0, &sizes0, &w, None),
        Member::start(&d.path(".gpu/tp/o-9"), &json0, &sizes0, &w, None),
    ];
    for m in &members {
        let (state, errno, msg) = m.outcome();
        assert_eq!((state, errno), (FAILED, libc::ENOENT), "{msg}");
        assert!(msg.contains("puts tp/o-9"), "{msg}");
    }
    drop(members);

    // Two putters of one key: the second to publish is told the key exists, and the window
    // fails for the others naming the key and both putters.
    let w = window("twice", 3, 0, 0, 0);
    let members = [
        Member::start(&a.path(".gpu/tp/t-0"), &json0, &sizes0, &w, Some(&data0)),
        Member::start(&d.path(".gpu/tp/t-0"), &json0, &sizes0, &w, Some(&data0)),
        Member::start(&b.path(".gpu/tp/t-0"), &json0, &sizes0, &w, None),
    ];
    let mut named = 0;
    for m in &members {
        let (state, errno, msg) = m.outcome();
        assert_eq!((state, errno), (FAILED, libc::EEXIST), "{msg}");
        assert!(msg.contains("tp/t-0"), "{msg}");
        // Member ids follow the order of joins, which the publishes' race decides.
        if msg.contains("tp/t-0 by member")
            && msg.contains("on node gpm-a")
            && msg.contains("on node gpm-d")
        {
            named += 1;
        } else {
            assert!(msg.contains("already exists"), "{msg}");
        }
    }
    assert_eq!(named, 2, "the getter and the first putter are told why");
}

/// A caller in a pod of its own: its IPC, PID and mount namespaces (a /dev/shm of its own), a
/// network namespace joined to the host by a veth pair, and uid 1000. It publishes the bytes
/// of `data` under the table, prints `published`, and holds the key until its stdin closes.
const POD_CALLER: &str = r#"
import ctypes, importlib.util, mmap, os, select, sys
spec = importlib.util.spec_from_file_location("gpu_abi", sys.argv[1])
abi = importlib.util.module_from_spec(spec); spec.loader.exec_module(abi)
control, data_file, table, sizes = sys.argv[2], sys.argv[3], sys.argv[4], [int(s) for s in sys.argv[5].split(",")]
# The NCCL this caller uses, mapped as torch maps its own: a file only the pod's mounts hold.
nccl = mmap.mmap(os.open(sys.argv[6], os.O_RDONLY), 0, prot=mmap.PROT_READ)
data = open(data_file, "rb").read()
shm = "/dev/shm/pod-src"
with open(shm, "wb") as f:
    f.write(data)
os.chmod(shm, 0o600)
libc = ctypes.CDLL(None, use_errno=True)
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
fd = os.open(control, os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, table.encode())
b = abi.Buffers(); b.version = abi.ABI_VERSION; b.flags = abi.COMMIT; b.count = len(sizes)
at = 0
for i, n in enumerate(sizes):
    e = b.buffers[i]
    e.kind, e.device, e.entry, e.offset, e.nbytes = abi.BUF_HOST_SHM, -1, i, at, n
    ctypes.memmove(e.handle, b"pod-src", 7)
    at += n
t = libc.ioctl(fd, abi.PUT, ctypes.addressof(b))
if t < 0:
    sys.exit("PUT: " + os.strerror(ctypes.get_errno()))
select.select([fd], [], [], 60)
st = abi.Status(); st.transfer = t
libc.ioctl(fd, abi.STATUS, ctypes.addressof(st))
if st.state != abi.DONE:
    sys.exit("PUT failed: " + st.message.decode())
print("published", os.getpid(), flush=True)
sys.stdin.read()
"#;

/// A network namespace joined to the host by a veth pair, deleted when dropped.
struct PodNet(&'static str);

impl PodNet {
    fn new(name: &'static str, host: &str, pod: &str) -> PodNet {
        let run = |args: &[&str]| {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let _ = std::process::Command::new("ip")
            .args(["netns", "delete", name])
            .output();
        run(&["netns", "add", name]);
        let net = PodNet(name);
        let (outer, inner) = (format!("{name}-h"), format!("{name}-p"));
        run(&[
            "link", "add", &outer, "type", "veth", "peer", "name", &inner,
        ]);
        run(&["link", "set", &inner, "netns", name]);
        run(&["addr", "add", &format!("{host}/24"), "dev", &outer]);
        run(&["link", "set", &outer, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", name, "ip"];
            all.extend_from_slice(args);
            run(&all);
        };
        inside(&["addr", "add", &format!("{pod}/24"), "dev", &inner]);
        inside(&["link", "set", &inner, "up"]);
        inside(&["link", "set", "lo", "up"]);
        net
    }
}

impl Drop for PodNet {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the pair, and with it the other.
        let _ = std::process::Command::new("ip")
            .args(["netns", "delete", self.0])
            .output();
    }
}

fn status_field(pid: i32, name: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
}

fn ns_of(pid: i32, ns: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
        .map(|l| l.display().to_string())
        .unwrap_or_default()
}

#[test]
fn a_pods_caller_gets_a_worker_in_its_namespaces_as_its_user_with_no_capability() {
    use std::io::BufRead;
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::new("127.0.0.161");
    let _net = PodNet::new("ktgpu", "10.201.0.1", "10.201.0.2");
    // The node's address is the host end of the pair: the pod's worker listens on its own
    // address towards it, and the host's workers reach the pod's through it.
    let a = start_mount("10.201.0.1", &c.server.addr, &c.path("a"), "gpn-a", &[]);
    // uid 1000 walks to the mount point and the files it is given.
    for d in [c.path(""), c.path("a")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let (json, sizes) = table(20);
    let total: u64 = sizes.iter().sum();
    let data = pseudo_random(total as usize, 31);
    let data_file = c.path("data");
    std::fs::write(&data_file, &data).unwrap();
    let script = c.path("pod_caller.py");
    std::fs::write(&script, POD_CALLER).unwrap();
    let abi_py = c.path("gpu_abi.py");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("python/ktfs/gpu_abi.py"),
        &abi_py,
    )
    .unwrap();
    for f in [&data_file, &script, &abi_py] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let sizes_arg = sizes
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    // The pod's own NCCL, at a path that is an empty directory outside the pod.
    let pod_lib_dir = c.path("podlib");
    std::fs::create_dir_all(&pod_lib_dir).unwrap();
    let pod_lib = pod_lib_dir.join("libnccl.so.2");
    let inner = format!(
        "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && mount -t tmpfs -o mode=755 tmpfs {lib_dir} \
         && printf 'the pod NCCL' > {lib} && chmod 644 {lib} \
         && exec setpriv --reuid 1000 --regid 1000 \
         --clear-groups /usr/bin/python3 {} {} {} {} '{}' {} {lib}",
        script.display(),
        abi_py.display(),
        a.path(".gpu/pod-sd").display(),
        data_file.display(),
        json,
        sizes_arg,
        lib_dir = pod_lib_dir.display(),
        lib = pod_lib.display(),
    );
    let mut pod = std::process::Command::new("ip")
        .args([
            "netns", "exec", "ktgpu", "unshare", "--pid", "--fork", "--ipc",
        ])
        .args(["--mount", "--mount-proc", "sh", "-c", &inner])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(pod.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("published"), "the pod's caller: {line:?}");

    // Its worker: in the pod's namespaces (not the agent's), uid 1000, no capability.
    let agent = a.proc.as_ref().unwrap().pid() as i32;
    let workers: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&pid: &i32| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("--enter"))
        })
        .collect();
    let worker = *workers
        .iter()
        .find(|&&w| status_field(w, "Uid:").is_some_and(|u| u.starts_with("1000")))
        .unwrap_or_else(|| panic!("no worker runs as uid 1000 among {workers:?}"));
    for ns in ["pid", "ipc", "mnt", "net"] {
        assert_ne!(
            ns_of(worker, ns),
            ns_of(agent, ns),
            "the worker shares the agent's {ns}"
        );
    }
    assert_eq!(
        status_field(worker, "Uid:")
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["1000"; 4]
    );
    assert_eq!(status_field(worker, "CapEff:").unwrap(), "0000000000000000");
    assert_eq!(status_field(worker, "CapBnd:").unwrap(), "0000000000000000");
    assert_eq!(status_field(worker, "NoNewPrivs:").unwrap(), "1");

    // It loads the NCCL its caller mapped, from the pod: the first directory of its loader's
    // path is one it made in the pod, whose `libnccl.so` names the pod's path, and it holds no
    // descriptor of a directory outside the pod.
    let environ = std::fs::read(format!("/proc/{worker}/environ")).unwrap();
    let ld_path = environ
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(b"LD_LIBRARY_PATH="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .expect("the pod's worker has no LD_LIBRARY_PATH");
    let link_dir = PathBuf::from(ld_path.split(':').next().unwrap());
    assert!(
        link_dir.starts_with(std::env::temp_dir())
            && link_dir.to_string_lossy().contains("kt-nccl-pod-"),
        "the pod's worker's LD_LIBRARY_PATH: {ld_path}"
    );
    let in_pod = |p: &Path| PathBuf::from(format!("/proc/{worker}/root{}", p.display()));
    assert_eq!(
        std::fs::read_link(in_pod(&link_dir.join("libnccl.so"))).unwrap(),
        pod_lib,
        "the link the pod's worker loads NCCL through"
    );
    assert!(
        std::fs::read(&pod_lib).is_err(),
        "the pod's library is outside the pod"
    );
    assert_eq!(
        std::fs::read(in_pod(&pod_lib)).unwrap(),
        b"the pod NCCL",
        "the pod's worker does not see the pod's library there"
    );
    for fd in std::fs::read_dir(format!("/proc/{worker}/fd")).unwrap() {
        let target = std::fs::read_link(fd.unwrap().path()).unwrap_or_default();
        assert!(
            !target.is_dir() || target.starts_with("/dev"),
            "the pod's worker holds directory {target:?}"
        );
    }

    // A getter on the host receives the pod's bytes, its own worker reaching the pod's.
    let dst = Shm::new("pod-dst", &vec![0u8; total as usize]);
    let get = open(&a.path(".gpu/pod-sd"), false);
    write_all(&get, json.as_bytes());
    let g = ioctl(&get, KT_GPU_GET, &mut buffers(&dst, &sizes, BUF_HOST_SHM)).expect("GET");
    let st = finished(&get, g);
    assert_eq!(st.state, DONE, "{}", message(&st));
    assert!(std::fs::read(&dst.0).unwrap() == data, "the bytes differ");
    drop(get);

    // The pod's caller lets go: its worker ends, and the key is unpublished.
    drop(pod.stdin.take());
    assert!(pod.wait().unwrap().success());
    assert!(
        eventually(Duration::from_secs(10), || !Path::new(&format!(
            "/proc/{worker}"
        ))
        .exists()),
        "the pod's worker outlived its last registration"
    );
    assert!(
        eventually(Duration::from_secs(10), || !link_dir.exists()),
        "the agent kept the worker's NCCL directory"
    );
    assert!(eventually(Duration::from_secs(10), || {
        c.kt(None, &["ls", "pod-sd"]).status.code() == Some(3)
    }));
}

#[test]
fn a_running_get_reports_how_far_it_is() {
    let c = Cluster::new("127.0.0.162");
    let a = start_mount("127.0.0.162", &c.server.addr, &c.path("a"), "gpr-a", &[]);
    let b = start_mount("127.0.0.163", &c.server.addr, &c.path("b"), "gpr-b", &[]);
    // 32 entries of 4 MiB: many chunks, so the transfer can be caught half way.
    let json = serde_json::json!({"entries": (0..32)
        .map(|i| serde_json::json!({"name": format!("w{i}"), "dtype": "uint8", "shape": [4 << 20]}))
        .collect::<Vec<_>>()})
    .to_string();
    let sizes = vec![4u64 << 20; 32];
    let total: u64 = sizes.iter().sum();
    let data = pseudo_random(total as usize, 41);
    let src = Shm::new("prog-src", &data);
    let _put = publish(&a.path(".gpu/big"), &json, &src, &sizes);
    let worker = worker_of(a.proc.as_ref().unwrap().pid()).expect("the publisher's worker");

    let dst = Shm::new("prog-dst", &vec![0u8; total as usize]);
    let get = open(&b.path(".gpu/big"), false);
    write_all(&get, json.as_bytes());
    let g = ioctl(&get, KT_GPU_GET, &mut buffers(&dst, &sizes, BUF_HOST_SHM)).unwrap();
    // Once some bytes are in, the source stops: STATUS says how many, and that is where it
    // stays until the source goes on.
    let start = Instant::now();
    let mut st = status(&get, g);
    while st.bytes_done == 0 && st.state != DONE && start.elapsed() < Duration::from_secs(30) {
        st = status(&get, g);
    }
    signal(worker, libc::SIGSTOP);
    // Whatever fails below, the source goes on (a stopped worker would hold the mount's exit).
    struct Cont(i32);
    impl Drop for Cont {
        fn drop(&mut self) {
            signal(self.0, libc::SIGCONT);
        }
    }
    let cont = Cont(worker);
    let caught = status(&get, g);
    // 128 MiB do not cross loopback between two STATUS calls.
    assert_eq!(caught.state, RUNNING, "{}", message(&caught));
    assert!(
        caught.bytes_done > 0 && caught.bytes_done < total,
        "{} of {total}",
        caught.bytes_done
    );
    // What was in flight lands; then nothing more, and not all of it.
    let mut last = caught.bytes_done;
    let settled = eventually(Duration::from_secs(10), || {
        std::thread::sleep(Duration::from_millis(150));
        let now = status(&get, g).bytes_done;
        std::mem::replace(&mut last, now) == now
    });
    assert!(
        settled && last < total,
        "{last} of {total} with the source stopped"
    );
    drop(cont);
    let st = finished(&get, g);
    assert_eq!((st.state, st.bytes_done), (DONE, total), "{}", message(&st));
    assert!(std::fs::read(&dst.0).unwrap() == data);
}

/// Every frame on the loopback interface while it runs (an AF_PACKET socket: the tests run as
/// root), for what crossed the network between workers.
struct Sniffer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<u8>>,
}

impl Sniffer {
    fn start() -> Sniffer {
        let all = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain socket calls on a descriptor owned from here on, with valid arguments.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(all)) };
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut at: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        at.sll_family = libc::AF_PACKET as u16;
        at.sll_protocol = all;
        at.sll_ifindex = unsafe { libc::if_nametoindex(c"lo".as_ptr()) } as i32;
        let bound = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&at as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(bound, 0, "bind: {}", std::io::Error::last_os_error());
        let set = |opt: i32, v: &[u8]| unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                v.as_ptr().cast(),
                v.len() as u32,
            )
        };
        // Room for everything a test moves, so that nothing is dropped unseen.
        set(libc::SO_RCVBUFFORCE, &(256i32 << 20).to_ne_bytes());
        let tick = libc::timeval {
            tv_sec: 0,
            tv_usec: 50_000,
        };
        // SAFETY: a timeval's bytes, as SO_RCVTIMEO takes them.
        let tick = unsafe {
            std::slice::from_raw_parts(
                (&tick as *const libc::timeval).cast::<u8>(),
                std::mem::size_of::<libc::timeval>(),
            )
        };
        set(libc::SO_RCVTIMEO, tick);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut buf = vec![0u8; 1 << 18];
            while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
                // SAFETY: `buf` is valid for its length.
                let n =
                    unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n > 0 {
                    seen.extend_from_slice(&buf[..n as usize]);
                }
            }
            seen
        });
        Sniffer { stop, thread }
    }

    fn stop(self) -> Vec<u8> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}

/// How many of the 64-byte pieces of `data` at every `step` bytes appear whole in `wire`.
fn pieces_seen(wire: &[u8], data: &[u8], step: usize) -> usize {
    let mut first: std::collections::HashMap<[u8; 8], Vec<usize>> = Default::default();
    for at in (0..data.len().saturating_sub(64)).step_by(step) {
        first
            .entry(data[at..at + 8].try_into().unwrap())
            .or_default()
            .push(at);
    }
    let mut seen = std::collections::HashSet::new();
    for (i, w) in wire.windows(8).enumerate() {
        if let Some(ats) = first.get(<&[u8; 8]>::try_from(w).unwrap()) {
            for &at in ats {
                if wire.get(i..i + 64) == Some(&data[at..at + 64]) {
                    seen.insert(at);
                }
            }
        }
    }
    seen.len()
}

#[test]
fn with_tokens_the_host_transport_carries_only_ciphertext_between_holders_of_the_servers_secret() {
    let ip = "127.0.0.207";
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "gpu-s3cret\n").unwrap();
    let tok = token.to_str().unwrap();
    let server = spawn_ready(&[
        "server",
        "--listen",
        &format!("{ip}:0"),
        "--data-dir",
        dir.path().join("store").to_str().unwrap(),
        "--token-file",
        tok,
    ]);
    let with_token = ["--token-file", tok];
    let a = start_mount(
        ip,
        &server.addr,
        &dir.path().join("a"),
        "sealed-a",
        &with_token,
    );
    let b = start_mount(
        "127.0.0.215",
        &server.addr,
        &dir.path().join("b"),
        "sealed-b",
        &with_token,
    );
    let (json, sizes) = table(50);
    let total: u64 = sizes.iter().sum();
    let data = pseudo_random(total as usize, 207);
    let src = Shm::new("sealed-src", &data);
    std::fs::create_dir_all(a.path(".gpu/model")).unwrap();
    let put = open(&a.path(".gpu/model/sealed"), true);
    write_all(&put, json.as_bytes());
    let t = ioctl(&put, KT_GPU_PUT, &mut buffers(&src, &sizes, BUF_HOST_SHM)).expect("PUT");
    let st = finished(&put, t);
    assert_eq!(st.state, DONE, "{}", message(&st));

    let sniffer = Sniffer::start();
    let dst = Shm::new("sealed-dst", &vec![0u8; total as usize]);
    let get = open(&b.path(".gpu/model/sealed"), false);
    write_all(&get, json.as_bytes());
    let g = ioctl(&get, KT_GPU_GET, &mut buffers(&dst, &sizes, BUF_HOST_SHM)).expect("GET");
    let st = finished(&get, g);
    let wire = sniffer.stop();
    assert_eq!(st.state, DONE, "{}", message(&st));
    assert!(
        std::fs::read(&dst.0).unwrap() == data,
        "the received bytes differ"
    );
    // The bytes crossed the loopback, between the two nodes' workers, sealed.
    assert!(
        wire.len() as u64 > total,
        "{} bytes seen on lo for {total} moved",
        wire.len()
    );
    assert_eq!(
        pieces_seen(&wire, &data, 512),
        0,
        "pieces of the state dict crossed the network in the clear"
    );
    // Nothing shows the secret: not the key's description.
    let desc = std::fs::read_to_string(b.path(".gpu/model/sealed")).unwrap();
    assert!(!desc.contains("secret"), "{desc}");

    // A window's chain: the second getter fetches from the first, whose registration the
    // server's plan gives it the secret of, as it gives the first the putter's.
    let sniffer = Sniffer::start();
    let w = window("sealed", 3, 0, 0, PACK);
    let getters = [
        Member::start(&b.path(".gpu/win/sd"), &json, &sizes, &w, None),
        Member::start(&b.path(".gpu/win/sd"), &json, &sizes, &w, None),
    ];
    let putter = Member::start(&a.path(".gpu/win/sd"), &json, &sizes, &w, Some(&data));
    for g in &getters {
        let (state, _, msg) = g.outcome();
        assert_eq!(state, DONE, "{msg}");
        assert!(g.bytes() == data, "a getter's bytes differ");
    }
    assert_eq!(putter.outcome().0, DONE);
    let wire = sniffer.stop();
    assert!(wire.len() as u64 > 2 * total);
    assert_eq!(pieces_seen(&wire, &data, 512), 0, "plaintext in the window");
}

/// Every user of a node may make a GPU key under `.gpu`, and only its owner or root unlinks,
/// and so unpublishes, it (issue 42, item 8): the directories are sticky, and a control file
/// belongs to the user who made it (any local user could unpublish anyone's key before).
#[test]
fn a_gpu_key_is_unlinked_by_its_owner_or_root_only() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let c = Cluster::new("127.0.0.54");
    let a = start_mount("127.0.0.54", &c.server.addr, &c.path("a"), "gpu-own", &[]);
    for d in [c.dir.path().to_path_buf(), c.path("a")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let gpu = a.path(".gpu");
    assert_eq!(std::fs::metadata(&gpu).unwrap().mode() & 0o7777, 0o1777);
    let mine = a.path(".gpu/mine");
    let made = mine.clone();
    let fd = as_user(1000, move || open(&made, true));
    assert_eq!(std::fs::metadata(&mine).unwrap().uid(), 1000);
    let unlink = |id: u32| {
        let path = mine.clone();
        as_user(id, move || {
            std::fs::remove_file(&path)
                .err()
                .and_then(|e| e.raw_os_error())
        })
    };
    assert_eq!(unlink(2000), Some(libc::EPERM), "another user unlinked it");
    // Its owner gets past the kernel's check (to the store, where nothing is published yet).
    assert_ne!(unlink(1000), Some(libc::EPERM));
    drop(fd);
}

/// A control file's descriptor acts for the process that opened it, and for no one once that
/// process is gone (issue 42, item 8): passed to another process, or left to a process that
/// took the opener's pid over, its ioctls fail with ESRCH instead of starting a worker as
/// whatever process has that pid now.
#[test]
fn a_control_file_passed_on_acts_for_no_one_once_its_opener_is_gone() {
    use std::os::unix::net::UnixListener;
    let c = Cluster::new("127.0.0.63");
    let a = start_mount(
        "127.0.0.63",
        &c.server.addr,
        &c.path("a"),
        "gpu-opener",
        &[],
    );
    let sock = c.path("pass.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let ctl = a.path(".gpu/passed");
    // Another process opens the control file, hands its descriptor over, and exits.
    let mut opener = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import os, socket\n\
             s = socket.socket(socket.AF_UNIX)\n\
             s.connect({sock:?})\n\
             fd = os.open({ctl:?}, os.O_RDWR | os.O_CREAT)\n\
             socket.send_fds(s, [b'x'], [fd])\n"
        ))
        .spawn()
        .unwrap();
    let (conn, _) = listener.accept().unwrap();
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let msg = nix::sys::socket::recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        nix::sys::socket::MsgFlags::empty(),
    )
    .unwrap();
    let fd = msg
        .cmsgs()
        .unwrap()
        .find_map(|c| match c {
            nix::sys::socket::ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
            _ => None,
        })
        .expect("a descriptor");
    // SAFETY: a descriptor just received, owned from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    assert!(opener.wait().unwrap().success());
    let (json, _) = table(1);
    write_all(&fd, json.as_bytes());
    let mut st = KtGpuStatus {
        transfer: 1,
        state: 0,
        error: 0,
        bytes_done: 0,
        bytes_total: 0,
        message: [0; 256],
    };
    assert_eq!(ioctl(&fd, KT_GPU_STATUS, &mut st), Err(libc::ESRCH));
    // The mount goes on serving everyone else.
    let fresh = open(&a.path(".gpu/fresh"), true);
    assert_eq!(ioctl(&fresh, KT_GPU_STATUS, &mut st), Err(libc::ENOENT));
}
