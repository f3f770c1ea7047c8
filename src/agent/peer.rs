//! The connections of the agent's socket, each with who made it as the kernel recorded it at
//! `connect(2)`: uid, gid and pid (SO_PEERCRED) and the supplementary groups (SO_PEERGROUPS).
//! A process's `/proc/PID/status` says what its leader is now, not what the thread that
//! connected was (a thread of another identity, a connection handed on, a pid reused), so the
//! groups a caller's files are opened with come from the socket.

use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::server::{Connected, UdsConnectInfo};

/// Who made a connection: what tonic's own Unix socket info holds, and the groups.
#[derive(Clone, Debug)]
pub struct PeerInfo {
    pub uds: UdsConnectInfo,
    /// None where the kernel does not say (before Linux 4.13).
    pub groups: Option<Arc<[libc::gid_t]>>,
}

/// A connection on the agent's socket.
pub struct PeerStream {
    inner: UnixStream,
    groups: Option<Arc<[libc::gid_t]>>,
}

impl PeerStream {
    fn new(inner: UnixStream) -> Self {
        let groups = peer_groups(&inner)
            .inspect_err(|e| tracing::debug!(error = %e, "SO_PEERGROUPS"))
            .ok()
            .map(Arc::from);
        PeerStream { inner, groups }
    }
}

/// The connections `listener` accepts, each with who made it.
pub fn accepted(listener: UnixListener) -> impl Stream<Item = io::Result<PeerStream>> {
    tokio_stream::wrappers::UnixListenerStream::new(listener).map(|c| c.map(PeerStream::new))
}

/// The supplementary groups of the process that connected `stream`, when it connected.
fn peer_groups(stream: &UnixStream) -> io::Result<Vec<libc::gid_t>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = libc::socklen_t::try_from(groups.len() * size_of::<libc::gid_t>())
            .map_err(io::Error::other)?;
        // SAFETY: getsockopt(2) writes at most `len` bytes into the buffer, which holds them,
        // and says in `len` how many it wrote, or needs where it answers ERANGE.
        let r = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let needed = len as usize / size_of::<libc::gid_t>();
        if r == 0 {
            groups.truncate(needed);
            return Ok(groups);
        }
        let err = io::Error::last_os_error();
        // Linux allows 65,536 groups: a larger answer is no kernel's.
        if err.raw_os_error() != Some(libc::ERANGE) || needed <= groups.len() || needed > 1 << 16 {
            return Err(err);
        }
        groups.resize(needed, 0);
    }
}

impl Connected for PeerStream {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        PeerInfo {
            uds: self.inner.connect_info(),
            groups: self.groups.clone(),
        }
    }
}

impl AsyncRead for PeerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for PeerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The groups are those of the thread that connected, not the process's now.
    #[tokio::test]
    async fn the_groups_are_the_connecting_threads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path).unwrap();
        let p = path.clone();
        let client = std::thread::spawn(move || {
            // SAFETY: a raw setgroups(2) of this thread alone, which ends after the connect.
            let r = unsafe { libc::syscall(libc::SYS_setgroups, 2, [4242u32, 4343].as_ptr()) };
            assert_eq!(r, 0, "{}", io::Error::last_os_error());
            std::os::unix::net::UnixStream::connect(p).unwrap()
        });
        let mut accepted = Box::pin(accepted(listener));
        let conn = accepted.next().await.unwrap().unwrap();
        let _client = client.join().unwrap();
        let info = conn.connect_info();
        assert_eq!(info.groups.as_deref(), Some(&[4242, 4343][..]));
        assert_eq!(
            info.uds.peer_cred.map(|c| c.pid()),
            Some(Some(std::process::id() as i32))
        );
    }
}
