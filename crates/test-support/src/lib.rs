//! The harness the workspace's integration tests share (ktfs's `tests/`, kt-csi's `csi/tests/`
//! and mount-helper's `mount-helper/tests/`): processes that print a ready line with their
//! address and are killed when dropped, polling with a limit, mounts (is it mounted, lazy
//! unmount), deterministic data, and the workspace's built binaries.
//!
//! What only one crate needs (a `kt server` with the tests' flags, the CSI clients...) stays in
//! that crate's tests, built on these pieces. Linux only: it reads `/proc` and calls `umount2`.

pub mod etcd;
pub mod s3;
pub mod tls;

use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How long [`spawn_ready`] waits for the ready line.
pub const READY_LIMIT: Duration = Duration::from_secs(60);

/// What a ready line says before the address.
const READY_MARK: &str = "listening on ";

/// A child process that is killed (SIGKILL) and reaped when dropped, started by [`spawn_ready`].
#[derive(Debug)]
pub struct Proc {
    pub child: Child,
    /// The address its ready line gave after `listening on ` (up to a `,` or a space).
    pub addr: String,
    /// The whole ready line.
    pub ready_line: String,
    /// Whether it was already waited for, so that drop has nothing to do.
    reaped: bool,
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the process with SIGTERM, as a user's Ctrl-C would, and waits for it.
    pub fn stop(mut self) -> ExitStatus {
        // SAFETY: signalling our own child, not yet reaped (so its pid is not reused).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("wait");
        self.reaped = true;
        status
    }

    /// Kills the process with SIGKILL, as a crash would, and reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `cmd` and waits, on its output and not on a clock, for its ready line: the first line
/// of its stdout with `listening on ADDR`. Its stdin is `/dev/null`, its stderr the test's; its
/// environment is the caller's business (this sets nothing). Its stdout is drained after the
/// ready line, so it never blocks on a full pipe.
///
/// Panics, naming the command, if it exits (or closes its stdout) before the ready line or has
/// not printed it within [`READY_LIMIT`]; the process is killed and reaped first.
pub fn spawn_ready(cmd: Command) -> Proc {
    spawn_until(cmd, Stream::Stdout, READY_MARK)
}

/// Which output of a child [`spawn_until`] reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Starts `cmd` and waits for the first line of its `stream` that contains `mark` (the other
/// stream is the test's), as [`spawn_ready`] does for a ready line; the process's [`Proc::addr`]
/// is what follows `listening on ` in that line, if anything. For programs not ours, which
/// announce themselves in words of their own.
pub fn spawn_until(mut cmd: Command, stream: Stream, mark: &str) -> Proc {
    let what = format!("{cmd:?}");
    cmd.stdin(Stdio::null());
    match stream {
        Stream::Stdout => cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()),
        Stream::Stderr => cmd.stdout(Stdio::inherit()).stderr(Stdio::piped()),
    };
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {what}: {e}"));
    let out: Box<dyn std::io::Read + Send> = match stream {
        Stream::Stdout => Box::new(child.stdout.take().expect("stdout is piped")),
        Stream::Stderr => Box::new(child.stderr.take().expect("stderr is piped")),
    };
    let (tx, rx) = mpsc::channel();
    let mark = mark.to_string();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(out).lines();
        for line in lines.by_ref() {
            let Ok(line) = line else { break };
            if line.contains(&mark) {
                let _ = tx.send(line);
                break;
            }
        }
        // Keep draining so the child never blocks on a full pipe.
        for _ in lines {}
    });
    let ready_line = match rx.recv_timeout(READY_LIMIT) {
        Ok(line) => line,
        Err(RecvTimeoutError::Disconnected) => {
            // Its stdout ended: it exited, or is about to.
            let gone = eventually(Duration::from_secs(5), || {
                matches!(child.try_wait(), Ok(Some(_)))
            });
            let _ = child.kill();
            let status = child.wait();
            match status {
                Ok(st) if gone => panic!("{what} exited before it was ready ({st})"),
                _ => panic!("{what} closed its stdout before it was ready"),
            }
        }
        Err(RecvTimeoutError::Timeout) => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not become ready within {} s",
                READY_LIMIT.as_secs()
            );
        }
    };
    let addr = ready_addr(&ready_line).to_string();
    Proc {
        child,
        addr,
        ready_line,
        reaped: false,
    }
}

/// The address in a ready line: what follows `listening on `, up to a `,` or a space.
fn ready_addr(line: &str) -> &str {
    line.split(READY_MARK)
        .nth(1)
        .and_then(|rest| rest.split([',', ' ']).next())
        .unwrap_or("")
}

/// Polls `cond` every 50 ms until it holds (true) or `limit` passes (false). `cond` is tried
/// once more at the limit, and the wait never sleeps past it.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond() {
            return true;
        }
        let elapsed = start.elapsed();
        if elapsed >= limit {
            return false;
        }
        std::thread::sleep((limit - elapsed).min(Duration::from_millis(50)));
    }
}

/// Whether process `pid` is alive: it exists and is neither a zombie nor dead.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses (and may hold any byte).
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Stops process `pid` (not a child of ours, say one a tested program started): SIGTERM, then
/// SIGKILL if it still lives after `grace`. Returns whether it is gone (it is waited for up to 5 s
/// after a SIGKILL).
pub fn terminate(pid: u32, grace: Duration) -> bool {
    let Ok(ipid) = i32::try_from(pid) else {
        return false;
    };
    if !alive(pid) {
        return true;
    }
    // SAFETY: signalling a process the test started.
    unsafe { libc::kill(ipid, libc::SIGTERM) };
    if eventually(grace, || !alive(pid)) {
        return true;
    }
    // SAFETY: as above.
    unsafe { libc::kill(ipid, libc::SIGKILL) };
    eventually(Duration::from_secs(5), || !alive(pid))
}

/// A tmpfs of `mib` MiB at its path (the tests run as root), unmounted when dropped: a disk
/// that fills.
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path, mib: u32) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(
            ok,
            "mounting a tmpfs at {} (the tests run as root)",
            dir.display()
        );
        Tmpfs(dir.to_path_buf())
    }

    /// A file that takes every byte still free; its path.
    pub fn fill(&self, name: &str) -> PathBuf {
        let path = self.0.join(name);
        // dd stops, with an error, when the disk is full: that is the point.
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=64k"])
            .arg(format!("of={}", path.display()))
            .stderr(Stdio::null())
            .status();
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        lazy_umount(&self.0);
    }
}

/// Detaches the mount at `path` now (`umount2(MNT_DETACH)`, as `umount -l`), even a dead FUSE
/// mount; errors (nothing mounted there, say) are ignored. Falls back to `umount -l` where the
/// call itself is refused.
pub fn lazy_umount(path: &Path) {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        return;
    }
    let err = std::io::Error::last_os_error().raw_os_error();
    if !matches!(err, Some(libc::EINVAL | libc::ENOENT | libc::ENOTDIR)) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(path)
            .stdin(Stdio::null())
            .status();
    }
}

/// Every mount point of this process's mount table (`/proc/self/mountinfo`), in its order,
/// escapes decoded.
pub fn mount_points() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| {
            t.lines()
                .filter_map(|l| l.split(' ').nth(4))
                .map(kt_host::mountinfo::unescape)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether something is mounted at `path`. The path is made absolute and clean, its parent's
/// symlinks resolved, without touching `path` itself (a dead FUSE mount there fails every stat).
pub fn is_mounted(path: &Path) -> bool {
    let path = normalize(path);
    mount_points().contains(&path)
}

/// An absolute, lexically clean `path` with its parent canonical.
fn normalize(path: &Path) -> PathBuf {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    };
    let mut clean = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::ParentDir => {
                clean.pop();
            }
            Component::CurDir => {}
            other => clean.push(other),
        }
    }
    match (clean.parent(), clean.file_name()) {
        (Some(parent), Some(name)) => parent
            .canonicalize()
            .map(|p| p.join(name))
            .unwrap_or(clean.clone()),
        _ => clean,
    }
}

/// A binary of this workspace, `target/PROFILE/NAME`: next to the `deps` directory the test
/// binary runs from (Cargo tells a package's tests only where that package's own binaries are).
/// Panics, saying how to build it, when it is missing.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/PROFILE/deps")
        .join(name);
    assert!(
        bin.is_file(),
        "{} is missing: build it first (`cargo build --bin {name}`, or run `cargo test --workspace`)",
        bin.display()
    );
    bin
}

/// Asserts that FUSE is there: tests that mount for real fail without it, they never skip.
pub fn require_fuse() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: these tests mount ktfs for real (run as root with FUSE{})",
        if std::env::var("CI").as_deref() == Ok("true") {
            "; CI must provide it"
        } else {
            ""
        }
    );
}

/// Runs a bash command (with pipefail), which must succeed; returns its stdout.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("set -o pipefail; {cmd}"))
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Deterministic pseudo-random bytes (xorshift64, all 8 bytes of each step), so every test run
/// moves the same data. Not the same bytes as [`pattern`] for the same seed.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Deterministic bytes (the same xorshift64 as [`pseudo_random`], one low byte a step).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_ready_takes_the_address_and_drop_kills() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo starting; echo 'listening on 1.2.3.4:5, x'; sleep 30",
        ]);
        let p = spawn_ready(cmd);
        assert_eq!(p.addr, "1.2.3.4:5");
        assert_eq!(p.ready_line, "listening on 1.2.3.4:5, x");
        let pid = p.pid();
        assert!(alive(pid));
        drop(p);
        // Reaped by the drop: no zombie left either.
        assert!(!alive(pid));
    }

    #[test]
    fn stop_and_kill_reap() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo listening on 127.0.0.1:1; exec sleep 30"]);
        let p = spawn_ready(cmd);
        assert_eq!(p.addr, "127.0.0.1:1");
        let pid = p.pid();
        let st = p.stop();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&st),
            Some(libc::SIGTERM)
        );
        assert!(!alive(pid));

        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo listening on 127.0.0.1:2 ; exec sleep 30"]);
        let p = spawn_ready(cmd);
        assert_eq!(p.addr, "127.0.0.1:2");
        let pid = p.pid();
        p.kill();
        assert!(!alive(pid));
    }

    #[test]
    fn a_command_that_exits_first_panics_with_its_name() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo not yet; exit 3"]);
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| spawn_ready(cmd)))
            .unwrap_err();
        let msg = err.downcast_ref::<String>().expect("a formatted panic");
        assert!(msg.contains("\"sh\""), "{msg}");
        assert!(msg.contains("exited before it was ready"), "{msg}");
        assert!(msg.contains("exit status: 3"), "{msg}");
    }

    #[test]
    fn eventually_gives_up_at_the_limit() {
        let start = Instant::now();
        let mut tries = 0;
        assert!(!eventually(Duration::from_millis(120), || {
            tries += 1;
            false
        }));
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(120), "{took:?}");
        assert!(took < Duration::from_millis(120 + 100), "{took:?}");
        assert!(tries >= 3, "{tries}");

        let mut n = 0;
        assert!(eventually(Duration::from_secs(5), || {
            n += 1;
            n == 3
        }));
    }

    #[test]
    fn data_is_deterministic() {
        assert_eq!(pseudo_random(1000, 7), pseudo_random(1000, 7));
        assert_ne!(pseudo_random(1000, 7), pseudo_random(1000, 8));
        assert_eq!(pseudo_random(13, 7), pseudo_random(1000, 7)[..13]);
        assert_eq!(pattern(1000, 7), pattern(1000, 7));
        assert_ne!(pattern(1000, 7), pattern(1000, 8));
        // The bytes the tests have always written (seed 1), computed apart from this code.
        assert_eq!(
            pseudo_random(8, 1),
            [0xad, 0x4d, 0xf3, 0x0b, 0xae, 0x77, 0x1b, 0xdc]
        );
        assert_eq!(
            pattern(8, 1),
            [0xad, 0x76, 0x36, 0x74, 0xec, 0x79, 0xcf, 0xea]
        );
    }

    #[test]
    fn mount_table_and_helpers() {
        assert!(is_mounted(Path::new("/")));
        assert!(is_mounted(Path::new("/proc/../proc")));
        assert!(!is_mounted(
            &std::env::temp_dir().join("no-such-mount-here")
        ));
        assert!(mount_points().contains(&PathBuf::from("/proc")));
        assert!(alive(std::process::id()));
        assert_eq!(sh("echo hi | tr a-z A-Z"), "HI\n");
        assert_eq!(ready_addr("x listening on [::1]:80 (pid 3)"), "[::1]:80");
        assert_eq!(ready_addr("no address"), "");
    }
}
