//! A store server and a node agent in this process (on 127.0.0.1:0), and filesystem cores
//! over the agent: the tests that drive `FsCore` without a mount share it.

use std::sync::Arc;
use std::time::Duration;

use ktfs::agent::{AgentConfig, AgentProcess};
use ktfs::clock::ManualClock;
use ktfs::fs::FsCore;
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
                gpu_host_key: Default::default(),
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

    pub fn core_with(&self, read_only: bool) -> FsCore {
        self.core_in("default", read_only)
    }

    /// A core over namespace `ns`.
    pub fn core_in(&self, ns: &str, read_only: bool) -> FsCore {
        let mut cfg =
            self.agent
                .fs_config(Namespace::parse(ns).unwrap(), Locale::Store, read_only, 0);
        cfg.clock = self.clock.shared();
        FsCore::new(cfg, self.rt.handle().clone(), self.blocks.clone()).unwrap()
    }

    pub fn core(&self) -> FsCore {
        self.core_with(false)
    }

    /// A core whose closes are queued and published in the background (`--writeback`), with
    /// its journal in the agent's database under `tag`.
    pub fn writeback_core(&self, tag: &[u8]) -> Arc<FsCore> {
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
        core
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
