//! A store server and a node agent in this process (on 127.0.0.1:0), and filesystem cores
//! over the agent: the tests that drive `FsCore` without a mount share it.

use std::sync::Arc;
use std::time::Duration;

use ktfs::agent::{AgentConfig, AgentProcess};
use ktfs::clock::ManualClock;
use ktfs::fs::{Attr, DirEntry, FsCore, PageCache};
use ktfs::key::Namespace;
use ktfs::proto::Locale;
use ktfs::server::StoreServerProcess;

/// A store server and a node agent in this process, and a filesystem core over the agent.
pub struct Rig {
    pub rt: tokio::runtime::Runtime,
    pub dir: tempfile::TempDir,
    pub server: String,
    pub clock: ManualClock,
    pub agent: AgentConfig,
    pub blocks: Arc<ktfs::blocks::node::NodeBlocks>,
    pub stop: tokio::sync::watch::Sender<bool>,
}

impl Rig {
    pub fn new() -> Rig {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let (server, agent, blocks) = rt.block_on(async {
            let srv = StoreServerProcess::bind(
                "127.0.0.1:0",
                &dir.path().join("store"),
                Duration::from_secs(30),
            )
            .await
            .unwrap();
            let server = srv.local_addr().unwrap().to_string();
            tokio::spawn(srv.run(until(stopped.clone())));
            let agent = AgentProcess::bind(AgentConfig {
                server: server.clone(),
                credential: ktfs::auth::Credential::none(),
                node_ticket: Default::default(),
                listen: "127.0.0.1:0".into(),
                advertise: None,
                cache_dir: dir.path().join("agent"),
                cache_size: 1 << 30,
                socket: dir.path().join("agent.sock"),
                node_id: "here".into(),
                zone: String::new(),
                heartbeat: Duration::from_secs(1),
                host_mounts: false,
                tls: None,
                fd_keeper: None,
            })
            .await
            .unwrap();
            agent.register().await.unwrap();
            let (cfg, blocks) = (agent.config().clone(), agent.blocks());
            tokio::spawn(agent.run(until(stopped)));
            (server, cfg, blocks)
        });
        Rig {
            rt,
            dir,
            server,
            clock: ManualClock::default(),
            agent,
            blocks,
            stop,
        }
    }

    pub fn core_with(&self, read_only: bool) -> Core {
        self.core_in("default", read_only)
    }

    /// A core over namespace `ns`.
    pub fn core_in(&self, ns: &str, read_only: bool) -> Core {
        let mut cfg =
            self.agent
                .fs_config(Namespace::parse(ns).unwrap(), Locale::Store, read_only, 0);
        cfg.clock = self.clock.shared();
        Core::new(Arc::new(
            FsCore::new(cfg, self.rt.handle().clone(), self.blocks.clone()).unwrap(),
        ))
    }

    pub fn core(&self) -> Core {
        self.core_with(false)
    }

    /// A core over namespace `default` that reaches the store and its peers through `remotes`
    /// (a failing store, misbehaving peers).
    pub fn core_through(&self, remotes: ktfs::transfer::remotes::Remotes) -> Core {
        let mut cfg = self.agent.fs_config(
            Namespace::parse("default").unwrap(),
            Locale::Store,
            false,
            0,
        );
        cfg.clock = self.clock.shared();
        let core = FsCore::with_remotes(
            cfg,
            self.rt.handle().clone(),
            self.blocks.clone(),
            ktfs::fs::names::inode::Inodes::default(),
            remotes,
        );
        Core::new(Arc::new(core.unwrap()))
    }

    /// A core whose closes are queued and published in the background (`--writeback`), with
    /// its journal in the agent's database under `tag`.
    pub fn writeback_core(&self, tag: &[u8]) -> Core {
        let mut cfg = self.agent.fs_config(
            Namespace::parse("default").unwrap(),
            Locale::Store,
            false,
            0,
        );
        cfg.clock = self.clock.shared();
        cfg.writeback = true;
        let core =
            Arc::new(FsCore::new(cfg, self.rt.handle().clone(), self.blocks.clone()).unwrap());
        core.start_writeback(self.blocks.db().clone(), tag.to_vec())
            .unwrap();
        Core::new(core)
    }

    /// `kt ARGS` against this rig's store server.
    pub fn kt(&self, args: &[&str]) -> String {
        let out = std::process::Command::new(super::kt_bin())
            .args(args)
            .args(["--server", &self.server])
            .env("KT_AGENT", self.dir.path().join("no-agent.sock"))
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kt {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// A filesystem core called as the FUSE adapter calls it: each call of the async core run to
/// its end on the caller's thread, outside the runtime. Calls that do not wait (`write`,
/// `fallocate`, `forget`...) are the core's own, through `Deref`.
pub struct Core {
    pub core: Arc<FsCore>,
    rt: tokio::runtime::Handle,
}

impl std::ops::Deref for Core {
    type Target = FsCore;
    fn deref(&self) -> &FsCore {
        &self.core
    }
}

type R<T> = Result<T, ktfs::fs::FsError>;

impl Core {
    /// Reads `fh` of `ino` from `out.len()` on, `chunk` bytes a call, until `out` holds `len`
    /// bytes; a read that returns nothing before then fails the test.
    pub fn read_on(&self, ino: u64, fh: u64, out: &mut Vec<u8>, len: usize, chunk: u32) {
        while out.len() < len {
            let got = self.read(ino, fh, out.len() as u64, chunk).unwrap();
            assert!(!got.is_empty(), "nothing at {} of {len}", out.len());
            out.extend_from_slice(&got);
        }
    }

    pub fn new(core: Arc<FsCore>) -> Core {
        let rt = core.runtime().clone();
        Core { core, rt }
    }

    fn wait<F: std::future::Future>(&self, call: F) -> F::Output {
        self.rt.block_on(call)
    }

    pub fn lookup(&self, parent: u64, name: &str) -> R<Attr> {
        self.wait(self.core.lookup(parent, name))
    }
    pub fn getattr(&self, ino: u64) -> R<Attr> {
        self.wait(self.core.getattr(ino))
    }
    pub fn getattr_open(&self, ino: u64, fh: Option<u64>) -> R<Attr> {
        self.wait(self.core.getattr_open(ino, fh))
    }
    pub fn readlink(&self, ino: u64) -> R<String> {
        self.wait(self.core.readlink(ino))
    }
    pub fn open(&self, ino: u64, flags: i32) -> R<(u64, PageCache)> {
        self.wait(self.core.open(ino, flags))
    }
    pub fn read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> R<bytes::Bytes> {
        self.wait(self.core.read(ino, fh, offset, size))
    }
    pub fn create(&self, parent: u64, name: &str, mode: u32, flags: i32) -> R<(Attr, u64)> {
        self.wait(self.core.create(parent, name, mode, flags))
    }
    pub fn flush(&self, fh: u64) -> R<()> {
        self.wait(self.core.flush(fh))
    }
    pub fn fsync(&self, fh: u64) -> R<()> {
        self.wait(self.core.fsync(fh))
    }
    pub fn release(&self, fh: u64) -> R<()> {
        self.wait(self.core.release(fh))
    }
    pub fn mkdir(&self, parent: u64, name: &str, mode: u32) -> R<Attr> {
        self.wait(self.core.mkdir(parent, name, mode))
    }
    pub fn symlink(&self, parent: u64, name: &str, target: &str) -> R<Attr> {
        self.wait(self.core.symlink(parent, name, target))
    }
    pub fn unlink(&self, parent: u64, name: &str) -> R<()> {
        self.wait(self.core.unlink(parent, name))
    }
    pub fn rmdir(&self, parent: u64, name: &str) -> R<()> {
        self.wait(self.core.rmdir(parent, name))
    }
    pub fn rename(&self, parent: u64, name: &str, to: u64, to_name: &str, flags: u32) -> R<()> {
        self.wait(self.core.rename(parent, name, to, to_name, flags))
    }
    #[allow(clippy::too_many_arguments)]
    pub fn setattr(
        &self,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        mtime: Option<std::time::SystemTime>,
        fh: Option<u64>,
    ) -> R<Attr> {
        self.wait(self.core.setattr(ino, mode, uid, gid, size, mtime, fh))
    }
    pub fn opendir(&self, ino: u64) -> R<u64> {
        self.wait(self.core.opendir(ino))
    }
    pub fn readdir(&self, ino: u64, fh: u64, offset: u64) -> R<Vec<(u64, DirEntry)>> {
        self.wait(self.core.readdir(ino, fh, offset))
    }
    pub fn copy_range(
        &self,
        ino_in: u64,
        fh_in: u64,
        offset_in: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
    ) -> R<u32> {
        self.wait(
            self.core
                .copy_range(ino_in, fh_in, offset_in, fh_out, offset_out, len),
        )
    }
    pub fn fsyncdir(&self, ino: u64) -> R<()> {
        self.wait(self.core.fsyncdir(ino))
    }
    pub fn setxattr(&self, ino: u64, name: &str, value: &[u8]) -> R<()> {
        self.wait(self.core.setxattr(ino, name, value))
    }
    pub fn getxattr(&self, ino: u64, name: &str) -> R<Vec<u8>> {
        self.wait(self.core.getxattr(ino, name))
    }
    pub fn listxattr(&self, ino: u64) -> R<Vec<u8>> {
        self.wait(self.core.listxattr(ino))
    }
    pub fn removexattr(&self, ino: u64, name: &str) -> R<()> {
        self.wait(self.core.removexattr(ino, name))
    }
}
