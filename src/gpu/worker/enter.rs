//! Putting a transfer worker where its caller is: the caller's IPC, network, PID and mount
//! namespaces, the caller's uid and gid, and no capability.
//!
//! The agent (privileged, `hostPID` in a cluster) starts `kt gpu-worker --enter PID` as a plain
//! child, so the binary and its shared libraries load from the agent's own filesystem. That
//! process, while it is still single-threaded (before any runtime starts: `setns` of a mount
//! namespace refuses a process whose threads share its filesystem attributes), opens the
//! caller's namespace files, joins the IPC, network and PID namespaces, and forks: only a child
//! is born into a PID namespace. The child joins the mount namespace last (after it, the
//! agent's paths are gone), so the pod's `/dev/shm` is the one it sees and the libraries it
//! loads later (libcuda, NCCL) are the pod's; then it drops to the caller's ids and becomes the
//! worker. The parent waits for it and exits with its status, holding nothing meanwhile.

use std::fs::File;
use std::os::fd::AsRawFd;

use super::error::WorkerError;

/// The namespaces a worker joins, by their `/proc/PID/ns` names and `setns` types, the mount
/// namespace last.
const JOINED: [(&str, libc::c_int); 4] = [
    ("ipc", libc::CLONE_NEWIPC),
    ("net", libc::CLONE_NEWNET),
    ("pid", libc::CLONE_NEWPID),
    ("mnt", libc::CLONE_NEWNS),
];

/// The identity of a process's namespaces, as the agent keys its workers: one per pod.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Namespaces(Vec<String>);

impl Namespaces {
    /// Those of process `pid` (`self` for this one).
    pub fn of(pid: &str) -> std::io::Result<Namespaces> {
        JOINED
            .iter()
            .map(|(ns, _)| {
                std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
                    .map(|l| l.to_string_lossy().into_owned())
            })
            .collect::<std::io::Result<Vec<_>>>()
            .map(Namespaces)
    }
}

/// The effective uid and gid of process `pid`, from `/proc/PID/status`.
pub fn ids_of(pid: u32) -> std::io::Result<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("no {name} line in /proc/{pid}/status"),
                )
            })
    };
    Ok((field("Uid:")?, field("Gid:")?))
}

fn os_err(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> WorkerError {
    move |e| WorkerError::Spawn(format!("{what}: {e}"))
}

fn check(r: libc::c_int, what: &str) -> Result<(), WorkerError> {
    if r < 0 {
        return Err(os_err(what)(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Joins process `pid`'s namespaces and forks. Returns in the child, which is in all of them;
/// the parent never returns: it waits for the child and exits as it did, having closed
/// `keep_out` (the descriptors that must be the child's alone, such as the control socket,
/// whose end the agent watches to learn that the worker is gone).
///
/// Call it before any other thread exists.
pub fn enter(pid: u32, keep_out: &[i32]) -> Result<(), WorkerError> {
    let files: Vec<(File, libc::c_int, &str)> = JOINED
        .iter()
        .map(|&(ns, kind)| {
            File::open(format!("/proc/{pid}/ns/{ns}"))
                .map(|f| (f, kind, ns))
                .map_err(os_err(format!("the {ns} namespace of process {pid}")))
        })
        .collect::<Result<_, _>>()?;
    let (before, mnt) = files.split_at(files.len() - 1);
    for (f, kind, ns) in before {
        // SAFETY: a namespace file this process holds open, with its type.
        check(
            unsafe { libc::setns(f.as_raw_fd(), *kind) },
            &format!("joining the {ns} namespace of process {pid}"),
        )?;
    }
    // SAFETY: this process is single-threaded (the caller's contract), so the child may do
    // anything the parent could.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(os_err("fork")(std::io::Error::last_os_error()));
    }
    if child > 0 {
        for &fd in keep_out {
            // SAFETY: closing a descriptor this process owns and no longer uses.
            unsafe { libc::close(fd) };
        }
        std::process::exit(wait(child));
    }
    let (f, kind, _) = &mnt[0];
    // SAFETY: as above, in a single-threaded process.
    check(
        unsafe { libc::setns(f.as_raw_fd(), *kind) },
        &format!("joining the mount namespace of process {pid}"),
    )?;
    // The working directory was the agent's.
    check(unsafe { libc::chdir(c"/".as_ptr()) }, "chdir /")?;
    Ok(())
}

fn wait(child: libc::pid_t) -> i32 {
    loop {
        let mut status = 0;
        // SAFETY: waiting for this process's own child.
        let r = unsafe { libc::waitpid(child, &mut status, 0) };
        if r == child {
            if libc::WIFEXITED(status) {
                return libc::WEXITSTATUS(status);
            }
            if libc::WIFSIGNALED(status) {
                return 128 + libc::WTERMSIG(status);
            }
        } else if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 1;
        }
    }
}

/// Becomes `uid`:`gid` with no supplementary group and no capability, for good: the bounding
/// and ambient sets emptied and `no_new_privs` set, so nothing this process runs regains one.
/// And not dumpable, whatever the uid: the caller's user (root in a pod too) can neither trace
/// it nor open its `/proc/PID/fd` (its control socket to the agent, the other workers'
/// connections and buffers).
pub fn drop_privileges(uid: u32, gid: u32) -> Result<(), WorkerError> {
    // Emptying the bounding set needs CAP_SETPCAP: first, while this process has it. Past the
    // last capability the kernel knows, the call fails with EINVAL, which ends the loop.
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINVAL) => break,
                // Without CAP_SETPCAP (an unprivileged agent) there is nothing to drop it from.
                Some(libc::EPERM) => break,
                _ => return Err(os_err("dropping the bounding set")(e)),
            }
        }
    }
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    // SAFETY: plain system calls on this process's own credentials.
    unsafe {
        if libc::getuid() == 0 || libc::geteuid() == 0 {
            check(libc::setgroups(0, std::ptr::null()), "setgroups")?;
        }
        check(libc::setresgid(gid, gid, gid), "setresgid")?;
        check(libc::setresuid(uid, uid, uid), "setresuid")?;
    }
    // A uid 0 caller keeps its capabilities through setresuid: clear them.
    let header = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: capset(2) with a v3 header and the two data structs it reads.
    check(
        unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) as libc::c_int },
        "capset",
    )?;
    // SAFETY: prctl with integer arguments.
    check(
        unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) },
        "no_new_privs",
    )?;
    // A change of uid makes a process undumpable; a uid 0 caller's worker changes none.
    // SAFETY: prctl with integer arguments.
    check(
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) },
        "not dumpable",
    )?;
    Ok(())
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The address of this host that `peer` would be reached from: a routing decision (a UDP
/// socket's connect sends nothing), so that a worker in a pod's network listens on the pod's
/// address.
pub fn local_address_towards(peer: &str) -> Result<std::net::IpAddr, WorkerError> {
    let ip: std::net::IpAddr = peer
        .parse()
        .map_err(|_| WorkerError::Bad(format!("{peer:?} is not an IP address")))?;
    let any = if ip.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let s = std::net::UdpSocket::bind(any).map_err(os_err("a routing probe"))?;
    s.connect((ip, 9))
        .map_err(os_err(format!("no route to the node at {peer}")))?;
    Ok(s.local_addr().map_err(os_err("a routing probe"))?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_known_by_its_namespaces_and_ids() {
        let me = Namespaces::of("self").unwrap();
        assert_eq!(me, Namespaces::of(&std::process::id().to_string()).unwrap());
        assert_eq!(me.0.len(), 4);
        assert!(me.0[2].starts_with("pid:["), "{:?}", me.0);
        // SAFETY: plain getters.
        let want = unsafe { (libc::geteuid(), libc::getegid()) };
        assert_eq!(ids_of(std::process::id()).unwrap(), want);
        assert!(ids_of(u32::MAX).is_err());
    }

    #[test]
    fn a_worker_of_a_root_caller_is_not_dumpable_either() {
        // SAFETY: the child only makes system calls and exits; the parent waits for it.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // uid 0 stays uid 0: only the explicit prctl makes it undumpable.
            let dropped = drop_privileges(0, 0).is_ok();
            // SAFETY: prctl with integer arguments.
            let dumpable = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
            // SAFETY: _exit(2) ends the forked child without running the test harness's code.
            unsafe { libc::_exit(if dropped && dumpable == 0 { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child stayed dumpable or could not drop its privileges: {status:#x}"
        );
    }

    #[test]
    fn the_local_address_towards_loopback_is_loopback() {
        assert_eq!(
            local_address_towards("127.0.0.1").unwrap().to_string(),
            "127.0.0.1"
        );
        assert!(local_address_towards("not-an-ip").is_err());
    }
}
