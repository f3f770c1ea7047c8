//! A real etcd server for the tests of cluster mode's metadata engine: Debian's `etcd`
//! (package `etcd-server`, which the test command installs), one member on a loopback address,
//! its data on `/dev/shm` where there is one, so that its fsyncs cost what memory costs.
//! Heartbeat and election are slowed down so that a starved machine does not pass for a dead
//! member.

use std::path::Path;
use std::process::Command;

use crate::{spawn_until, Proc, Stream};

/// What etcd logs once it answers clients.
const SERVING: &str = "serving client traffic";

pub struct Etcd {
    pub proc: Proc,
    /// `HOST:PORT` of its client port.
    pub endpoint: String,
    _data: tempfile::TempDir,
}

impl Etcd {
    /// One member on `ip` (client port 2379, peer port 2380 of that address).
    pub fn start(ip: &str) -> Etcd {
        let shm = Path::new("/dev/shm");
        let data = match shm.is_dir() {
            true => tempfile::tempdir_in(shm),
            false => tempfile::tempdir(),
        }
        .expect("etcd's data directory");
        let (client, peer) = (format!("http://{ip}:2379"), format!("http://{ip}:2380"));
        let mut cmd = Command::new("etcd");
        cmd.args(["--name", "kt"])
            .arg("--data-dir")
            .arg(data.path())
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("kt={peer}")])
            .args(["--heartbeat-interval", "250", "--election-timeout", "2500"])
            .args(["--logger", "zap", "--log-outputs", "stderr"]);
        Etcd {
            proc: spawn_until(cmd, Stream::Stderr, SERVING),
            endpoint: format!("{ip}:2379"),
            _data: data,
        }
    }

    /// The address a store is given: `etcd://HOST:PORT/PREFIX`.
    pub fn url(&self, prefix: &str) -> String {
        format!("etcd://{}/{prefix}", self.endpoint)
    }
}
