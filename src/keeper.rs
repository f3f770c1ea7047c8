//! The FUSE device keeper (`kt keeper --socket PATH -- kt agent ...`): a small process that
//! holds each mount's `/dev/fuse` descriptor and runs the agent as its child.
//!
//! A FUSE mount lives as long as some process holds its device descriptor. When the agent that
//! serves a mount dies, the keeper still holds it, so the kernel keeps the mount and queues its
//! requests: readers wait instead of seeing "transport endpoint is not connected". The keeper
//! restarts the agent, which takes the descriptors back (`list`), replays the kernel's FUSE_INIT
//! to a fresh session and asks the kernel to resend the requests the dead agent had read but
//! not answered (see `mount::resume`). SIGHUP to the keeper hands the mounts over to a new agent
//! on purpose (an upgrade): the agent gets SIGUSR1, publishes what is open for writing and exits
//! without unmounting. SIGTERM or SIGINT stop the agent, which unmounts, and then the keeper.
//!
//! The socket speaks one request and one reply per connection: a little-endian `u32` length,
//! then a `KeeperRequest`/`KeeperReply`, with descriptors attached to the first byte
//! (SCM_RIGHTS). Only the agent's user can use it (the socket is created mode 0600).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use prost::Message;

use crate::proto::{keeper_request::Op, KeeperReply, KeeperRequest, KeptMount};

/// The environment variable that tells the agent where its keeper listens.
pub const ENV: &str = "KT_FD_KEEPER";
/// Descriptors one message may carry (the kernel allows 253): mounts one agent may keep.
pub const MAX_FDS: usize = 128;
const MAX_MESSAGE: usize = 16 << 20;
/// How long one request may take on the socket.
const IO_LIMIT: Duration = Duration::from_secs(10);
/// An agent that dies this soon after it started counts as failing to start.
const QUICK_EXIT: Duration = Duration::from_secs(10);
/// Quick exits in a row after which the keeper gives up (and exits, so that whoever started
/// it sees the failure).
const MAX_QUICK_EXITS: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    #[error("the FUSE keeper at {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the FUSE keeper's socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("the FUSE keeper's socket: {0}")]
    Sys(#[from] nix::Error),
    #[error("the FUSE keeper's protocol: {0}")]
    Protocol(String),
    #[error("the FUSE keeper refused: {0}")]
    Refused(String),
    #[error("another keeper is listening on {0}")]
    Busy(String),
    #[error("the agent failed {0} times within seconds of starting; giving up")]
    GaveUp(u32),
}

/// Sends one message with `fds` attached.
fn send(stream: &UnixStream, body: &[u8], fds: &[RawFd]) -> Result<(), KeeperError> {
    if fds.len() > MAX_FDS {
        return Err(KeeperError::Protocol(format!(
            "{} descriptors in one message (at most {MAX_FDS})",
            fds.len()
        )));
    }
    let mut msg = Vec::with_capacity(4 + body.len());
    msg.extend_from_slice(&(body.len() as u32).to_le_bytes());
    msg.extend_from_slice(body);
    let cmsgs: Vec<ControlMessage> = if fds.is_empty() {
        Vec::new()
    } else {
        vec![ControlMessage::ScmRights(fds)]
    };
    let mut sent = sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(&msg)],
        &cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    // The descriptors went with the first byte; the rest is plain data.
    while sent < msg.len() {
        sent += sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(&msg[sent..])],
            &[],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )?;
    }
    Ok(())
}

/// Receives one message and the descriptors attached to it.
fn recv(stream: &UnixStream) -> Result<(Vec<u8>, Vec<OwnedFd>), KeeperError> {
    let mut first = vec![0u8; 64 << 10];
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut fds = Vec::new();
    let n = {
        let mut iov = [IoSliceMut::new(&mut first)];
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        // Own every descriptor at once, so that an error below closes them.
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel just installed these descriptors in this process for us.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        msg.bytes
    };
    if n == 0 {
        return Err(KeeperError::Protocol("connection closed".into()));
    }
    first.truncate(n);
    let mut stream_ref = stream;
    if first.len() < 4 {
        let mut rest = vec![0u8; 4 - first.len()];
        stream_ref.read_exact(&mut rest)?;
        first.extend_from_slice(&rest);
    }
    let len = u32::from_le_bytes([first[0], first[1], first[2], first[3]]) as usize;
    if len > MAX_MESSAGE {
        return Err(KeeperError::Protocol(format!("a message of {len} bytes")));
    }
    let mut body = first.split_off(4);
    if body.len() > len {
        return Err(KeeperError::Protocol("more bytes than announced".into()));
    }
    let have = body.len();
    body.resize(len, 0);
    stream_ref.read_exact(&mut body[have..])?;
    Ok((body, fds))
}

/// Whether a kept descriptor still belongs to a mounted filesystem: the kernel reports an
/// error on it once the mount is gone.
fn is_alive(fd: BorrowedFd<'_>) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(fd, PollFlags::empty())];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => !fds[0].revents().is_some_and(|r| {
            r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL)
        }),
        Err(_) => false,
    }
}

/// What the keeper holds: each mount's record and device descriptor, by mountpoint.
#[derive(Default)]
pub struct Keeper {
    mounts: Mutex<BTreeMap<String, (KeptMount, OwnedFd)>>,
}

impl Keeper {
    /// Binds the keeper's socket; a stale socket file is replaced, a live one refused.
    pub fn bind(path: &Path) -> Result<UnixListener, KeeperError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(KeeperError::Busy(path.display().to_string()));
            }
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path).map_err(|source| KeeperError::Connect {
            path: path.display().to_string(),
            source,
        })?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok(listener)
    }

    /// Answers requests on `listener` in a thread of its own, for the life of the process.
    pub fn serve(self: Arc<Self>, listener: UnixListener) -> std::io::Result<()> {
        std::thread::Builder::new()
            .name("kt-keeper".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    let Ok(stream) = conn else { continue };
                    let _ = stream.set_read_timeout(Some(IO_LIMIT));
                    let _ = stream.set_write_timeout(Some(IO_LIMIT));
                    if let Err(e) = self.answer(&stream) {
                        tracing::warn!(error = %e, "a keeper request failed");
                    }
                }
            })
            .map(|_| ())
    }

    fn answer(&self, stream: &UnixStream) -> Result<(), KeeperError> {
        let (body, mut fds) = recv(stream)?;
        let req = KeeperRequest::decode(body.as_slice())
            .map_err(|e| KeeperError::Protocol(e.to_string()))?;
        let mut reply = KeeperReply::default();
        let mut out: Vec<RawFd> = Vec::new();
        let mut table = crate::locks::lock(&self.mounts);
        match req.op {
            Some(Op::Keep(kept)) => {
                let mp = kept
                    .mount
                    .as_ref()
                    .map(|m| m.mountpoint.clone())
                    .unwrap_or_default();
                match (fds.pop(), mp.is_empty(), fds.is_empty()) {
                    (Some(fd), false, true) => {
                        tracing::info!(mountpoint = %mp, "keeping the mount's FUSE device");
                        table.insert(mp, (kept, fd));
                    }
                    _ => reply.error = "keep takes one mountpoint and one descriptor".into(),
                }
            }
            Some(Op::List(_)) => {
                table.retain(|mp, (_, fd)| {
                    let alive = is_alive(fd.as_fd());
                    if !alive {
                        tracing::info!(mountpoint = %mp, "the mount is gone; dropping its device");
                    }
                    alive
                });
                for (kept, fd) in table.values() {
                    reply.mounts.push(kept.clone());
                    out.push(fd.as_raw_fd());
                }
            }
            Some(Op::Release(mp)) => {
                if table.remove(&mp).is_some() {
                    tracing::info!(mountpoint = %mp, "released the mount's FUSE device");
                }
            }
            None => reply.error = "an empty request".into(),
        }
        // The descriptors stay open (held by the table) until the reply is sent.
        send(stream, &reply.encode_to_vec(), &out)
    }
}

/// The agent's side of the keeper's socket.
#[derive(Clone, Debug)]
pub struct KeeperClient {
    path: PathBuf,
}

impl KeeperClient {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        KeeperClient { path: path.into() }
    }

    fn call(
        &self,
        req: KeeperRequest,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(KeeperReply, Vec<OwnedFd>), KeeperError> {
        let stream = UnixStream::connect(&self.path).map_err(|source| KeeperError::Connect {
            path: self.path.display().to_string(),
            source,
        })?;
        stream.set_read_timeout(Some(IO_LIMIT))?;
        stream.set_write_timeout(Some(IO_LIMIT))?;
        let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
        send(&stream, &req.encode_to_vec(), &fds)?;
        let (body, fds) = recv(&stream)?;
        let reply = KeeperReply::decode(body.as_slice())
            .map_err(|e| KeeperError::Protocol(e.to_string()))?;
        if !reply.error.is_empty() {
            return Err(KeeperError::Refused(reply.error));
        }
        Ok((reply, fds))
    }

    /// Hands the keeper a copy of a mount's device descriptor.
    pub fn keep(&self, kept: KeptMount, fd: BorrowedFd<'_>) -> Result<(), KeeperError> {
        self.call(
            KeeperRequest {
                op: Some(Op::Keep(kept)),
            },
            Some(fd),
        )
        .map(|_| ())
    }

    /// Every mount the keeper holds, with a copy of its descriptor.
    pub fn list(&self) -> Result<Vec<(KeptMount, OwnedFd)>, KeeperError> {
        let (reply, fds) = self.call(
            KeeperRequest {
                op: Some(Op::List(true)),
            },
            None,
        )?;
        if reply.mounts.len() != fds.len() {
            return Err(KeeperError::Protocol(format!(
                "{} mounts but {} descriptors",
                reply.mounts.len(),
                fds.len()
            )));
        }
        Ok(reply.mounts.into_iter().zip(fds).collect())
    }

    /// Tells the keeper a mount ends on purpose.
    pub fn release(&self, mountpoint: &str) -> Result<(), KeeperError> {
        self.call(
            KeeperRequest {
                op: Some(Op::Release(mountpoint.to_string())),
            },
            None,
        )
        .map(|_| ())
    }
}

fn signal(pid: Option<u32>, sig: nix::sys::signal::Signal) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

/// Runs `program args` (the agent) with [`ENV`] pointing at the keeper's socket, restarting it
/// whenever it dies, until it exits on its own with success or the keeper is told to stop.
/// Returns the agent's last exit code.
pub async fn supervise(
    socket: &Path,
    program: &OsString,
    args: &[OsString],
) -> Result<i32, KeeperError> {
    use nix::sys::signal::Signal;
    use tokio::signal::unix::{signal as on, SignalKind};
    let keeper = Arc::new(Keeper::default());
    keeper.clone().serve(Keeper::bind(socket)?)?;
    let mut term = on(SignalKind::terminate())?;
    let mut int = on(SignalKind::interrupt())?;
    let mut hup = on(SignalKind::hangup())?;
    let mut quick_exits = 0u32;
    loop {
        let started = Instant::now();
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .env(ENV, socket)
            .stdin(std::process::Stdio::null())
            .spawn()?;
        let pid = child.id();
        println!(
            "kt keeper on {}: agent pid {}",
            socket.display(),
            pid.unwrap_or(0)
        );
        let mut stopping = false;
        let mut handover = false;
        let status = loop {
            tokio::select! {
                s = child.wait() => break s?,
                _ = term.recv() => { stopping = true; signal(pid, Signal::SIGTERM) }
                _ = int.recv() => { stopping = true; signal(pid, Signal::SIGTERM) }
                _ = hup.recv() => {
                    tracing::info!("handing the mounts over to a new agent");
                    handover = true;
                    signal(pid, Signal::SIGUSR1)
                }
            }
        };
        let code = status.code().unwrap_or(1);
        if stopping || (status.success() && !handover) {
            return Ok(code);
        }
        if handover {
            quick_exits = 0;
            continue;
        }
        tracing::warn!(%status, "the agent died; starting it again on the same mounts");
        quick_exits = if started.elapsed() < QUICK_EXIT {
            quick_exits + 1
        } else {
            0
        };
        if quick_exits >= MAX_QUICK_EXITS {
            return Err(KeeperError::GaveUp(quick_exits));
        }
        let pause = Duration::from_millis(100 << quick_exits);
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = term.recv() => return Ok(code),
            _ = int.recv() => return Ok(code),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{FuseInit, MountRequest};
    use std::io::Write;

    fn kept(mp: &str) -> KeptMount {
        KeptMount {
            mount: Some(MountRequest {
                mountpoint: mp.into(),
                namespace: "ns".into(),
                ..Default::default()
            }),
            init: Some(FuseInit {
                major: 7,
                minor: 41,
                max_readahead: 1 << 20,
                flags: 1 << 39,
            }),
        }
    }

    /// Descriptors travel both ways and stay the same open file: what is written into a pipe
    /// through the keeper's copy comes out of the original.
    #[test]
    fn keeps_lists_and_releases_descriptors() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("keeper.sock");
        let keeper = Arc::new(Keeper::default());
        keeper.clone().serve(Keeper::bind(&sock).unwrap()).unwrap();
        assert!(
            matches!(Keeper::bind(&sock), Err(KeeperError::Busy(_))),
            "a second keeper on a live socket is refused"
        );
        let client = KeeperClient::new(&sock);
        let (r, w) = nix::unistd::pipe().unwrap();
        client.keep(kept("/mnt/a"), w.as_fd()).unwrap();
        drop(w);
        let listed = client.list().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].0, kept("/mnt/a"));
        let mut copy = std::fs::File::from(listed.into_iter().next().unwrap().1);
        copy.write_all(b"through the keeper").unwrap();
        drop(copy);
        let mut r = std::fs::File::from(r);
        let mut got = [0u8; 18];
        r.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"through the keeper");
        client.release("/mnt/a").unwrap();
        assert!(client.list().unwrap().is_empty());
        // With every copy of the write end closed, the pipe reads end-of-file.
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
    }

    #[test]
    fn refuses_a_keep_without_a_descriptor_and_drops_dead_ones() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("k.sock");
        let keeper = Arc::new(Keeper::default());
        keeper.clone().serve(Keeper::bind(&sock).unwrap()).unwrap();
        let client = KeeperClient::new(&sock);
        let e = client
            .call(
                KeeperRequest {
                    op: Some(Op::Keep(kept("/mnt/b"))),
                },
                None,
            )
            .unwrap_err();
        assert!(matches!(e, KeeperError::Refused(_)), "{e}");
        // A pipe's write end whose reader is gone reports an error, as a dead mount's device
        // does: the keeper stops offering it.
        let (r, w) = nix::unistd::pipe().unwrap();
        client.keep(kept("/mnt/c"), w.as_fd()).unwrap();
        drop((r, w));
        assert!(client.list().unwrap().is_empty());
    }
}
