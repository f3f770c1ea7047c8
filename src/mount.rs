//! `kt mount`: the node agent with the filesystem mounted, in one process.
//!
//! The agent (peer server, unix socket, heartbeat, block cache) runs on the tokio runtime; the
//! FUSE session runs on its own threads and calls into the filesystem core, which uses the same
//! runtime for its RPCs and transfers. The process ends when it is signalled (it unmounts) or
//! when someone unmounts it (it stops the agent); either way, files still open for writing are
//! published first.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use fuser::{Config, MountOption, SessionACL};

use crate::agent::AgentBlocks;
use crate::fs::fuse::FuseAdapter;
use crate::fs::{FsConfig, FsCore};

/// FUSE worker threads: reads of different files, or of different blocks, proceed in parallel.
const FUSE_THREADS: usize = 8;
/// Kernel readahead for the mount, in KiB: large sequential reads become 1 MiB requests, several
/// in flight.
const READ_AHEAD_KB: u32 = 4096;
/// How long a signalled mount waits for its FUSE session to end after unmounting.
const UNMOUNT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

pub struct Mounted {
    unmounter: fuser::SessionUnmounter,
    done: tokio::sync::oneshot::Receiver<()>,
    core: Arc<FsCore>,
    pub mountpoint: PathBuf,
}

/// Mounts the filesystem over an agent's `blocks` at `mountpoint`, ready when this returns.
/// Runs inside the agent's tokio runtime (a blocking thread of it will do).
pub fn mount(blocks: Arc<AgentBlocks>, cfg: FsConfig, mountpoint: &Path) -> Result<Mounted> {
    std::fs::create_dir_all(mountpoint)
        .with_context(|| format!("creating {}", mountpoint.display()))?;
    let core = Arc::new(FsCore::new(
        cfg.clone(),
        tokio::runtime::Handle::current(),
        blocks,
    )?);
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("ktfs:{}", cfg.namespace)),
        MountOption::Subtype("kt".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    if cfg.read_only {
        config.mount_options.push(MountOption::RO);
    }
    config.acl = SessionACL::All;
    config.n_threads = Some(FUSE_THREADS);
    config.clone_fd = true;
    let mut session = fuser::Session::new(FuseAdapter::new(core.clone()), mountpoint, &config)
        .with_context(|| format!("mounting {}", mountpoint.display()))?;
    let unmounter = session.unmount_callable();
    let (tx, done) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("kt-fuse".into())
        .spawn(move || {
            if let Err(e) = session.run() {
                tracing::error!(error = %e, "FUSE session ended with an error");
            }
            let _ = tx.send(());
        })?;
    raise_read_ahead(mountpoint);
    Ok(Mounted {
        unmounter,
        done,
        core,
        mountpoint: mountpoint.to_path_buf(),
    })
}

/// Sets the mount's kernel readahead; the default 128 KiB caps sequential reads well below
/// what the mount can serve.
fn raise_read_ahead(mountpoint: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let knob = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    if let Err(e) = std::fs::write(&knob, READ_AHEAD_KB.to_string()) {
        tracing::debug!(error = %e, %knob, "could not raise readahead");
    }
}

impl Mounted {
    /// Waits until `shutdown` completes (then unmounts) or the filesystem is unmounted from
    /// outside; publishes what is still open for writing.
    pub async fn serve_until(mut self, shutdown: impl std::future::Future<Output = ()>) {
        tokio::select! {
            _ = shutdown => {
                // Publish first: a process may keep a file open past the unmount, and the data
                // it wrote must not wait for it.
                let core = self.core.clone();
                let _ = tokio::task::spawn_blocking(move || core.flush_all()).await;
                if let Err(e) = self.unmounter.unmount() {
                    tracing::warn!(error = %e, "unmount failed; detaching the mount");
                    lazy_unmount(&self.mountpoint);
                }
                // A detached mount lives until its last open file closes; do not wait for that.
                if tokio::time::timeout(UNMOUNT_WAIT, &mut self.done).await.is_err() {
                    tracing::warn!("files are still open on the detached mount; exiting anyway");
                }
            }
            _ = &mut self.done => {
                let core = self.core.clone();
                let _ = tokio::task::spawn_blocking(move || core.flush_all()).await;
            }
        }
    }
}

fn lazy_unmount(path: &Path) {
    if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) {
        // SAFETY: a valid C string; MNT_DETACH detaches even while files are open.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}
