//! Who called on the agent's socket (its peer credentials, SO_PEERCRED and SO_PEERGROUPS: see
//! `peer`), and the files such a caller names, opened with the caller's rights rather than the agent's.
//!
//! The agent usually runs as root. A path a caller names is opened on a blocking thread whose
//! filesystem identity (fsuid, fsgid, supplementary groups: per thread on Linux, through the
//! raw system calls) is the caller's for the one open, so the kernel checks the caller's access:
//! a user who cannot read `/etc/shadow` cannot have the agent serve it either. Every open is
//! non-blocking (a FIFO with no writer would hold the thread) and must find a regular file.

use std::fs::File;
use std::io;
use std::path::Path;

use tonic::Status;

use super::peer::PeerInfo;
use crate::blocks::in_place::open_regular;
use crate::rpc::status::{to_status, Fault};

/// A process on the other end of the agent's socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
    /// Its supplementary groups when it connected; None where the kernel did not say.
    pub groups: Option<Vec<libc::gid_t>>,
}

impl Caller {
    /// The caller of `req`, from the socket's peer credentials.
    pub fn of<T>(req: &tonic::Request<T>) -> Result<Caller, Status> {
        let peer = req.extensions().get::<PeerInfo>();
        let cred = peer.and_then(|p| p.uds.peer_cred).ok_or_else(|| {
            to_status(
                Fault::Denied,
                "the agent could not tell who called (no peer credentials)",
            )
        })?;
        Ok(Caller {
            uid: cred.uid(),
            gid: cred.gid(),
            pid: cred.pid(),
            groups: peer.and_then(|p| p.groups.as_deref().map(<[_]>::to_vec)),
        })
    }

    /// Whether the caller may administer this agent (mount and unmount filesystems): root, or
    /// the agent's own user.
    pub fn may_administer(&self) -> Result<(), Status> {
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if self.uid == 0 || self.uid == me {
            return Ok(());
        }
        Err(to_status(
            Fault::Denied,
            format!(
                "uid {} may not mount or unmount through this agent: only root may",
                self.uid
            ),
        ))
    }

    /// Opens `path` for reading as the caller would: with its rights, without blocking, and
    /// only if it is a regular file. Blocks: call it off the async threads.
    pub fn open(&self, path: &Path) -> io::Result<File> {
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        let file = if self.uid == me {
            open_regular(path)?
        } else if me == 0 {
            let groups = self.groups();
            as_user(self.uid, self.gid, &groups, || open_regular(path))?
        } else {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "uid {} may not hand files to an agent of another user (uid {me})",
                    self.uid
                ),
            ));
        };
        Ok(file)
    }

    /// The caller's supplementary groups: the socket's word, else (a kernel before 4.13) its
    /// process's status; none if it is gone.
    fn groups(&self) -> Vec<libc::gid_t> {
        if let Some(groups) = &self.groups {
            return groups.clone();
        }
        let Some(pid) = self.pid else {
            return Vec::new();
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            return Vec::new();
        };
        status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .map(|g| {
                g.split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Runs `f` on this thread with the filesystem identity of `uid`, `gid` and `groups`, then
/// restores the thread's own. setfsuid, setfsgid and the raw setgroups change this thread only
/// (glibc's setgroups would change every thread of the process).
fn as_user<T>(
    uid: u32,
    gid: u32,
    groups: &[libc::gid_t],
    f: impl FnOnce() -> io::Result<T>,
) -> io::Result<T> {
    // SAFETY: a size of 0 only asks how many groups there are.
    let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut own =
        vec![0 as libc::gid_t; usize::try_from(count).map_err(|_| io::Error::last_os_error())?];
    // SAFETY: the buffer holds as many entries as the call is told.
    let n = unsafe { libc::getgroups(count, own.as_mut_ptr()) };
    own.truncate(usize::try_from(n).map_err(|_| io::Error::last_os_error())?);
    let set_groups = |g: &[libc::gid_t]| {
        // SAFETY: a raw setgroups(2) with a pointer to `g.len()` gids.
        let r = unsafe { libc::syscall(libc::SYS_setgroups, g.len(), g.as_ptr()) };
        match r {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    };
    set_groups(groups)?;
    // SAFETY: setfsgid/setfsuid(2) take any id and change this thread's filesystem ids only;
    // each returns the previous id, restored below.
    let (old_gid, old_uid) = unsafe { (libc::setfsgid(gid), libc::setfsuid(uid)) };
    // setfsuid reports no failure: ask again what the ids are now.
    // SAFETY: an invalid id (-1) only queries.
    let (now_uid, now_gid) = unsafe { (libc::setfsuid(u32::MAX), libc::setfsgid(u32::MAX)) };
    let out = if now_uid as u32 == uid && now_gid as u32 == gid {
        f()
    } else {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the agent could not take its caller's identity to open a file",
        ))
    };
    // SAFETY: as above, back to the ids this thread had.
    unsafe {
        libc::setfsuid(old_uid as u32);
        libc::setfsgid(old_gid as u32);
    }
    set_groups(&own)?;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// As root, a file only root may read is refused to another caller, a file that caller may
    /// read is opened, and the thread is itself again afterwards.
    #[test]
    fn a_caller_opens_only_what_it_may_read_itself() {
        // SAFETY: geteuid(2) cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            // Opening as another user needs root; the tests run as root (scripts/test.sh).
            panic!("this test runs as root");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"root only").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let open = dir.path().join("open");
        std::fs::write(&open, b"anyone").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let nobody = Caller {
            uid: 65534,
            gid: 65534,
            pid: None,
            groups: Some(Vec::new()),
        };
        let err = nobody.open(&secret).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert!(nobody.open(&open).is_ok());
        // Root again: the secret opens.
        assert!(open_regular(&secret).is_ok());
        let fifo = dir.path().join("fifo");
        let fifo_c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) with a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo_c.as_ptr(), 0o666) }, 0);
        let err = nobody.open(&fifo).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }
}
