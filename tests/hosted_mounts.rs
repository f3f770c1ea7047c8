//! Mounts hosted by one agent, and mounts that outlive it: `kt agent --host-mounts` serving
//! the mounts of several namespaces in one process (`kt attach`/`kt detach`), and `kt keeper`
//! restarting a killed agent on its mounts while readers only pause. Real FUSE mounts; these
//! tests need /dev/fuse and root and never skip themselves.

mod common;

use std::fs;
use std::process::Command;
use std::time::Duration;

use common::*;

const MIB: usize = 1 << 20;
const SETTLE: Duration = Duration::from_secs(10);

/// `kt attach`: one agent (`--host-mounts`) mounts several namespaces in its own process.
#[test]
fn one_agent_hosts_the_mounts_of_several_namespaces() {
    let c = Cluster::new("127.0.0.124");
    let dir = c.path("node");
    let agent = start_agent_with(
        "127.0.0.125",
        &c.server.addr,
        &dir,
        "node-1",
        &["--host-mounts"],
    );
    let sock = agent.socket.clone();
    let (a, b) = (dir.join("mnt-a"), dir.join("mnt-b"));
    let (a_s, b_s) = (a.to_str().unwrap(), b.to_str().unwrap());
    let attach = |args: &[&str]| {
        let mut all = vec!["attach"];
        all.extend_from_slice(args);
        kt_with(&c.server.addr, &sock, &all)
    };
    let ok = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // A multi-block file in team-b, read through team-b's mount of the same agent.
    let big = c.path("big.bin");
    fs::write(&big, pseudo_random(9 * MIB + 3, 24)).unwrap();
    c.ok(
        None,
        &[
            "put",
            "big.bin",
            "--src",
            big.to_str().unwrap(),
            "-n",
            "team-b",
        ],
    );

    assert!(ok(attach(&[a_s, "-n", "team-a"])).contains("mounted namespace team-a"));
    assert!(ok(attach(&[b_s, "-n", "team-b", "--read-only"])).contains("mounted namespace team-b"));
    assert!(is_mounted(&a) && is_mounted(&b));
    // Asking again is success; another namespace on a taken mountpoint is not.
    assert!(ok(attach(&[a_s, "-n", "team-a"])).contains("already mounted"));
    let out = attach(&[a_s, "-n", "team-b"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already the mount of namespace team-a"));

    fs::write(a.join("hello.txt"), b"hi from a").unwrap();
    let ls_a: serde_json::Value =
        serde_json::from_str(&c.ok(None, &["ls", "-n", "team-a", "--json"])).unwrap();
    assert_eq!(ls_names(&ls_a), vec!["hello.txt"]);
    assert!(
        fs::read(b.join("hello.txt")).is_err(),
        "namespaces are apart"
    );
    assert!(fs::read(b.join("big.bin")).unwrap() == fs::read(&big).unwrap());
    let err = fs::write(b.join("new"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    // The reader's blocks are in the one agent's cache: it becomes a source of them (its
    // registration is sent in the background, so a get may still find only the store).
    let mut n = 0;
    let mut last = String::new();
    let served = eventually(SETTLE, || {
        n += 1;
        let dest = c.path(&format!("got-{n}.bin"));
        let out = c.ok(
            None,
            &[
                "get",
                "big.bin",
                "-n",
                "team-b",
                "--dest",
                dest.to_str().unwrap(),
                "--json",
            ],
        );
        assert!(fs::read(&dest).unwrap() == fs::read(&big).unwrap());
        last = out.clone();
        let get: serde_json::Value = serde_json::from_str(&out).unwrap();
        listed_sources(&get) == ["node-1"]
    });
    assert!(served, "the hosting agent never served the blocks: {last}");

    ok(kt_with(&c.server.addr, &sock, &["detach", a_s]));
    assert!(!is_mounted(&a));
    assert!(is_mounted(&b));
    assert!(fs::read(b.join("big.bin")).unwrap() == fs::read(&big).unwrap());
    let out = kt_with(&c.server.addr, &sock, &["detach", a_s]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not mounted by this agent"));

    // Stopping the agent unmounts what it hosts.
    assert!(agent.proc.stop().success());
    assert!(!is_mounted(&b));

    // An agent started without --host-mounts says so.
    let plain = start_agent("127.0.0.125", &c.server.addr, &c.path("plain"), "node-2");
    let out = kt_with(
        &c.server.addr,
        &plain.socket,
        &["attach", c.path("mnt-c").to_str().unwrap()],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--host-mounts"));
}

/// `kt keeper` and the agent it runs, with every line they print on a channel.
struct Keeper {
    proc: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Keeper {
    fn start(socket: &std::path::Path, agent_args: &[String]) -> Keeper {
        let mut proc = Command::new(kt_bin())
            .args([
                "keeper",
                "--socket",
                socket.to_str().unwrap(),
                "--",
                kt_bin(),
            ])
            .args(agent_args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn kt keeper");
        let out = proc.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Keeper { proc, lines }
    }

    /// Waits for the next agent the keeper starts to be ready; returns its pid.
    fn next_agent(&self) -> i32 {
        let limit = Duration::from_secs(60);
        let mut pid = None;
        loop {
            let line = self
                .lines
                .recv_timeout(limit)
                .expect("the keeper started no agent");
            if let Some(p) = line.split("agent pid ").nth(1) {
                pid = Some(p.trim().parse().unwrap());
            } else if line.contains("listening on ") {
                if let Some(p) = pid {
                    return p;
                }
            }
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling a child of this test.
        unsafe { libc::kill(self.proc.id() as i32, sig) };
    }
}

impl Drop for Keeper {
    /// Stops the agent too (it unmounts), unless the test already did.
    fn drop(&mut self) {
        self.signal(libc::SIGTERM);
        let deadline = std::time::Instant::now() + SETTLE;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.proc.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

/// The kernel's FUSE control filesystem, mounted in a directory of the test's own.
struct FuseCtl(std::path::PathBuf);

impl FuseCtl {
    fn mount(at: std::path::PathBuf) -> FuseCtl {
        fs::create_dir_all(&at).unwrap();
        sh(&format!("mount -t fusectl fusectl {}", at.display()));
        FuseCtl(at)
    }

    /// Requests the kernel has sent to the FUSE mount at `mp` and not had answered.
    fn waiting(&self, mp: &std::path::Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let dev = fs::metadata(mp).unwrap().dev();
        let path = self.0.join(dev.to_string()).join("waiting");
        fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for FuseCtl {
    fn drop(&mut self) {
        lazy_umount(&self.0);
    }
}

/// An agent run by `kt keeper` that is killed while a read waits on it is started again on the
/// same mount: the read completes with the right bytes, an open file reads on, names looked up
/// before still resolve, writes work, and no reader sees "transport endpoint is not connected".
/// SIGHUP hands the mount over to a new agent the same way; SIGTERM unmounts and ends both.
#[test]
fn a_killed_agent_is_restarted_on_its_mounts_and_readers_only_pause() {
    use std::os::unix::fs::FileExt;
    let c = Cluster::new("127.0.0.140");
    // Fixed blocks of 2 MiB (content-defined ones vary in size, so how far a read ahead
    // reaches would too): a first read fetches the next eight ahead, those past 18 MiB stay
    // cold.
    let big = pseudo_random(48 * MIB + 5, 77);
    fs::write(c.path("big.bin"), &big).unwrap();
    c.ok(
        None,
        &[
            "put",
            "big.bin",
            "--src",
            c.path("big.bin").to_str().unwrap(),
            "--block-size",
            "2097152",
        ],
    );
    fs::create_dir_all(c.path("tree")).unwrap();
    fs::write(c.path("tree/a.txt"), b"inside a directory").unwrap();
    c.ok(
        None,
        &[
            "put",
            "tree",
            "--src",
            c.path("tree").to_str().unwrap(),
            "--contents",
        ],
    );

    let dir = c.path("node");
    let mp = dir.join("mnt");
    let agent_sock = dir.join("agent.sock");
    let agent_args: Vec<String> = [
        "agent",
        "--host-mounts",
        "--server",
        &c.server.addr,
        "--listen",
        "127.0.0.141:0",
        "--cache-dir",
        dir.join("cache").to_str().unwrap(),
        "--socket",
        agent_sock.to_str().unwrap(),
        "--node-id",
        "node-k",
        "--heartbeat-secs",
        "1",
    ]
    .map(String::from)
    .to_vec();
    let keeper = Keeper::start(&dir.join("keeper.sock"), &agent_args);
    let first = keeper.next_agent();
    let out = kt_with(
        &c.server.addr,
        &agent_sock,
        &["attach", mp.to_str().unwrap(), "-n", "default"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let file = fs::File::open(mp.join("big.bin")).unwrap();
    let mut head = vec![0u8; MIB];
    file.read_exact_at(&mut head, 0).unwrap();
    assert!(head == big[..MIB]);
    assert_eq!(
        fs::read(mp.join("tree/a.txt")).unwrap(),
        b"inside a directory"
    );

    // With the store stopped, a read of a cold block waits in the agent; the agent dies then.
    let ctl = FuseCtl::mount(c.path("fusectl"));
    signal(c.server.child.id() as i32, libc::SIGSTOP);
    let before = ctl.waiting(&mp);
    let reader = {
        let file = file.try_clone().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; MIB];
            let _ = tx.send(
                file.read_exact_at(&mut buf, (44 * MIB) as u64)
                    .map(|()| buf),
            );
        });
        rx
    };
    let waiting = eventually(SETTLE, || ctl.waiting(&mp) > before);
    signal(first, libc::SIGKILL);
    signal(c.server.child.id() as i32, libc::SIGCONT);
    assert!(waiting, "the read never reached the agent");
    let second = keeper.next_agent();
    assert_ne!(first, second);
    let got = reader
        .recv_timeout(SETTLE)
        .expect("the read in flight at the crash never completed")
        .expect("the read in flight at the crash");
    assert!(
        got == big[44 * MIB..45 * MIB],
        "the read in flight got wrong bytes"
    );

    // The file opened before the crash reads on, cold blocks included; so do names the kernel
    // looked up from the dead agent, and the mount takes writes.
    let mut tail = vec![0u8; 5];
    file.read_exact_at(&mut tail, (48 * MIB) as u64).unwrap();
    assert!(tail == big[48 * MIB..]);
    assert_eq!(
        fs::read(mp.join("tree/a.txt")).unwrap(),
        b"inside a directory"
    );
    fs::write(mp.join("after-crash.txt"), b"written after the restart").unwrap();
    let ls: serde_json::Value = serde_json::from_str(&c.ok(None, &["ls", "--json"])).unwrap();
    assert!(ls_names(&ls).contains(&"after-crash.txt".to_string()));

    // An upgrade: SIGHUP hands the mount to a new agent, with no error for the open file.
    keeper.signal(libc::SIGHUP);
    let third = keeper.next_agent();
    assert_ne!(second, third);
    let mut again = vec![0u8; MIB];
    file.read_exact_at(&mut again, (20 * MIB) as u64).unwrap();
    assert!(again == big[20 * MIB..21 * MIB]);
    assert_eq!(
        fs::read(mp.join("after-crash.txt")).unwrap(),
        b"written after the restart"
    );
    drop(file);

    // SIGTERM stops the agent, which unmounts, and then the keeper.
    let mut keeper = keeper;
    keeper.signal(libc::SIGTERM);
    let status = keeper.proc.wait().unwrap();
    assert!(status.success(), "keeper: {status}");
    assert!(!is_mounted(&mp));
}
