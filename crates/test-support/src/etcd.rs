//! A real etcd server for the tests of cluster mode's metadata engine: Debian's `etcd`
//! (package `etcd-server`, which the test command installs), one member on a loopback address
//! (or a cluster of several, [`cluster`]), its data on `/dev/shm` where there is one, so that its fsyncs cost what memory costs.
//! Heartbeat and election are slowed down so that a starved machine does not pass for a dead
//! member.

use std::path::Path;
use std::process::Command;

use crate::{spawn_until, Proc, Stream};

/// What etcd logs once it answers clients ("... insecurely" or "... securely").
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
        Self::start_with(ip, None, &[])
    }

    /// [`Etcd::start`] with a backend quota of `bytes` (`--quota-backend-bytes`): past it etcd
    /// raises its NOSPACE alarm and refuses writes.
    pub fn start_with_quota(ip: &str, bytes: u64) -> Etcd {
        Self::start_with(ip, None, &["--quota-backend-bytes", &bytes.to_string()])
    }

    /// [`Etcd::start`] with its client port on TLS: `ca`, `cert` and `key` are PEM files; clients
    /// must present a certificate of `ca` (etcd's `--client-cert-auth`).
    pub fn start_tls(ip: &str, ca: &Path, cert: &Path, key: &Path) -> Etcd {
        Self::start_with(ip, Some((ca, cert, key)), &[])
    }

    /// Saves a snapshot of its data in `path` (`etcdctl snapshot save`; Debian's package
    /// `etcd-client`, which the test command installs): a backup.
    pub fn snapshot(&self, path: &Path) {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoint, "snapshot", "save"])
            .arg(path)
            .output()
            .expect("etcdctl");
        assert!(
            out.status.success(),
            "etcdctl snapshot save: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// One member on `ip` whose data is restored from the snapshot at `path` (`etcdctl
    /// snapshot restore`): the etcd of the moment the snapshot was taken.
    pub fn restore(ip: &str, path: &Path) -> Etcd {
        let data = data_dir();
        let restored = data.path().join("restored");
        let peer = format!("http://{ip}:2380");
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["snapshot", "restore"])
            .arg(path)
            .arg("--data-dir")
            .arg(&restored)
            .args(["--name", "kt", "--initial-cluster", &format!("kt={peer}")])
            .args(["--initial-advertise-peer-urls", &peer])
            .output()
            .expect("etcdctl");
        assert!(
            out.status.success(),
            "etcdctl snapshot restore: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self::start_on(ip, (data, restored), None, &[])
    }

    fn start_with(ip: &str, tls: Option<(&Path, &Path, &Path)>, extra: &[&str]) -> Etcd {
        let data = data_dir();
        let at = data.path().to_path_buf();
        Self::start_on(ip, (data, at), tls, extra)
    }

    /// etcd on `ip` with its data in `data`'s path (a temporary directory's, or one in it).
    fn start_on(
        ip: &str,
        data: (tempfile::TempDir, std::path::PathBuf),
        tls: Option<(&Path, &Path, &Path)>,
        extra: &[&str],
    ) -> Etcd {
        let (data, at) = data;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let initial = format!("kt=http://{ip}:2380");
        let mut cmd = member_command(ip, scheme, &at, ("kt", &initial));
        cmd.args(extra);
        if let Some((ca, cert, key)) = tls {
            cmd.arg("--trusted-ca-file")
                .arg(ca)
                .arg("--cert-file")
                .arg(cert)
                .arg("--key-file")
                .arg(key)
                .arg("--client-cert-auth");
        }
        Etcd {
            proc: spawn_until(cmd, Stream::Stderr, SERVING),
            endpoint: format!("{ip}:2379"),
            _data: data,
        }
    }

    /// How many requests of gRPC method `method` of its KV service (`Range`, `Txn`, ...) it
    /// answered without error so far, from its metrics.
    pub fn answered(&self, method: &str) -> u64 {
        let out = Command::new("curl")
            .args(["-sf", &format!("http://{}/metrics", self.endpoint)])
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout);
        let of = format!("grpc_method=\"{method}\"");
        text.lines()
            .filter(|l| l.starts_with("grpc_server_handled_total{") && l.contains(&of))
            .filter(|l| l.contains("grpc_code=\"OK\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|n| n as u64)
            .sum()
    }

    /// The address a store is given: `etcd://HOST:PORT/PREFIX`.
    pub fn url(&self, prefix: &str) -> String {
        format!("etcd://{}/{prefix}", self.endpoint)
    }
}

/// Three members of one cluster (or as many as `ips`), one on each address, started together
/// (a member answers clients once a quorum of the cluster is up).
pub fn cluster(ips: &[&str]) -> Vec<Etcd> {
    let initial = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| format!("m{i}=http://{ip}:2380"))
        .collect::<Vec<_>>()
        .join(",");
    let starting: Vec<_> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            let (ip, initial) = (ip.to_string(), initial.clone());
            std::thread::spawn(move || {
                let data = data_dir();
                let cmd = member_command(&ip, "http", data.path(), (&format!("m{i}"), &initial));
                Etcd {
                    proc: spawn_until(cmd, Stream::Stderr, SERVING),
                    endpoint: format!("{ip}:2379"),
                    _data: data,
                }
            })
        })
        .collect();
    starting
        .into_iter()
        .map(|t| t.join().expect("an etcd member started"))
        .collect()
}

/// Which of `members` (one cluster's) leads it now, as `etcdctl endpoint status` tells.
pub fn leader(members: &[Etcd]) -> usize {
    let endpoints: Vec<&str> = members.iter().map(|m| m.endpoint.as_str()).collect();
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", &endpoints.join(","), "endpoint", "status"])
        .output()
        .expect("etcdctl");
    // A line an endpoint: "ENDPOINT, ID, VERSION, DB SIZE, IS LEADER, ...".
    let text = String::from_utf8_lossy(&out.stdout);
    let leading = text
        .lines()
        .find(|l| l.split(", ").nth(4) == Some("true"))
        .and_then(|l| l.split(", ").next())
        .unwrap_or_else(|| panic!("no member leads: {text}"));
    endpoints
        .iter()
        .position(|e| *e == leading)
        .expect("the leader is one of the members")
}

/// The command of the etcd member `name` of the cluster `initial` (etcd's
/// `--initial-cluster`) on `ip`, its data at `data`.
fn member_command(ip: &str, scheme: &str, data: &Path, (name, initial): (&str, &str)) -> Command {
    let (client, peer) = (format!("{scheme}://{ip}:2379"), format!("http://{ip}:2380"));
    let mut cmd = Command::new("etcd");
    cmd.args(["--name", name])
        .arg("--data-dir")
        .arg(data)
        .args(["--listen-client-urls", &client])
        .args(["--advertise-client-urls", &client])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", initial])
        .args(["--heartbeat-interval", "250", "--election-timeout", "2500"])
        .args(["--logger", "zap", "--log-outputs", "stderr"]);
    cmd
}

/// A temporary directory for etcd's data, on `/dev/shm` where there is one.
fn data_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    match shm.is_dir() {
        true => tempfile::tempdir_in(shm),
        false => tempfile::tempdir(),
    }
    .expect("etcd's data directory")
}
