//! Starting `kt mount` in the background, detached from the helper, and waiting until its
//! mount is in the mount table.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kt_host::mountinfo::unescape;

use crate::invocation::Invocation;

/// How long `kt mount` may take to mount, unless `timeout=` says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} is not a directory")]
    NotDirectory(PathBuf),
    #[error("{path} is already mounted ({fstype} {source_name})")]
    AlreadyMounted {
        path: PathBuf,
        fstype: String,
        source_name: String,
    },
    #[error("kt mount exited ({status}) before mounting: {log}")]
    Exited {
        status: std::process::ExitStatus,
        log: String,
    },
    #[error("kt mount did not mount {path} within {secs} s (stopped it; log {log_path}): {log}")]
    Timeout {
        path: PathBuf,
        secs: u64,
        log_path: PathBuf,
        log: String,
    },
}

/// A mount that came up.
#[derive(Debug)]
pub struct Mounted {
    pub pid: u32,
    pub mountpoint: PathBuf,
    pub log: PathBuf,
}

/// The `kt` to run: `kt=PATH`, else `kt` beside this executable (mount.kt's symlink target),
/// else the first on `PATH`, else `/usr/local/bin/kt` or `/usr/bin/kt`.
pub fn find_kt(inv: &Invocation) -> PathBuf {
    if let Some(kt) = &inv.options.kt {
        return kt.clone();
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("kt")));
    let on_path: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("kt")).collect())
        .unwrap_or_default();
    beside
        .into_iter()
        .chain(on_path)
        .chain([
            PathBuf::from("/usr/local/bin/kt"),
            PathBuf::from("/usr/bin/kt"),
        ])
        .find(|p| is_executable(p))
        .unwrap_or_else(|| PathBuf::from("kt"))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `(fstype, source)` of the mount at `path`, if it is a mount point.
pub fn mounted_at(path: &Path) -> Option<(String, String)> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    table.lines().rev().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        let mount_point = unescape(pre.split(' ').nth(4)?);
        if mount_point != path {
            return None;
        }
        let mut post = post.split(' ');
        let fstype = post.next()?.to_string();
        let source = unescape(post.next()?).to_string_lossy().into_owned();
        Some((fstype, source))
    })
}

fn is_kt_mount((fstype, source): &(String, String)) -> bool {
    fstype.starts_with("fuse") && source.starts_with("ktfs:")
}

/// Starts `kt` with `args` in its own session (stdout and stderr appended to `log`), and waits
/// until `mountpoint` is a ktfs mount, the process exits, or `timeout` passes.
pub fn mount(
    kt: &Path,
    args: &[OsString],
    mountpoint: &Path,
    log: &Path,
    timeout: Duration,
) -> Result<Mounted, SpawnError> {
    let io = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| SpawnError::Io { what, path, source }
    };
    let mountpoint = mountpoint
        .canonicalize()
        .map_err(io("resolving", mountpoint))?;
    if !mountpoint.is_dir() {
        return Err(SpawnError::NotDirectory(mountpoint));
    }
    if let Some((fstype, source_name)) = mounted_at(&mountpoint) {
        return Err(SpawnError::AlreadyMounted {
            path: mountpoint,
            fstype,
            source_name,
        });
    }
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    }
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io("opening", log))?;
    let log_start = out.metadata().map(|m| m.len()).unwrap_or(0);
    let err = out.try_clone().map_err(io("opening", log))?;
    let mut cmd = Command::new(kt);
    cmd.args(args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    // SAFETY: setsid is async-signal-safe. In its own session kt mount outlives this helper
    // and is out of reach of signals to the shell's process group.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(io("running", kt))?;
    let deadline = Instant::now() + timeout;
    loop {
        if mounted_at(&mountpoint).is_some_and(|m| is_kt_mount(&m)) {
            return Ok(Mounted {
                pid: child.id(),
                mountpoint,
                log: log.to_path_buf(),
            });
        }
        if let Some(status) = child.try_wait().map_err(io("waiting for", kt))? {
            return Err(SpawnError::Exited {
                status,
                log: log_tail(log, log_start),
            });
        }
        if Instant::now() > deadline {
            // A failed mount leaves nothing behind.
            let _ = child.kill();
            let _ = child.wait();
            return Err(SpawnError::Timeout {
                path: mountpoint,
                secs: timeout.as_secs(),
                log_path: log.to_path_buf(),
                log: log_tail(log, log_start),
            });
        }
        std::thread::sleep(POLL);
    }
}

/// What was appended to `path` since `from` (at most its last 2 KiB), on one line.
fn log_tail(path: &Path, from: u64) -> String {
    const MAX: u64 = 2048;
    let mut buf = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if f.seek(SeekFrom::Start(from.max(len.saturating_sub(MAX))))
            .is_ok()
        {
            let _ = f.read_to_end(&mut buf);
        }
    }
    let s = String::from_utf8_lossy(&buf)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if s.is_empty() {
        "(no output)".into()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_is_mounted_and_a_fresh_dir_is_not() {
        assert!(mounted_at(Path::new("/")).is_some());
        let d = tempfile::tempdir().unwrap();
        assert!(mounted_at(&d.path().canonicalize().unwrap()).is_none());
    }
}
