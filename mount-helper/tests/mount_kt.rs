//! mount.kt for real: a `kt server`, then `mount.kt SERVER DIR -o ...` as mount(8) runs it, a
//! file written and read through the mount, and `umount DIR`, after which `kt mount` is gone.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use test_support::{alive, eventually, lazy_umount, require_fuse, spawn_ready, Proc};

const IP: &str = "127.0.0.94";

/// `target/PROFILE/kt` of this workspace, next to the `deps` directory this test runs from.
fn kt_bin() -> PathBuf {
    test_support::workspace_bin("kt")
}

/// The helper under the name mount(8) looks for: a `mount.kt` symlink to the built binary.
fn mount_kt(dir: &Path) -> PathBuf {
    let link = dir.join("mount.kt");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_mount-kt"), &link).unwrap();
    }
    link
}

/// A `kt server` on `IP`; returns it and its address.
fn start_server(data: &Path) -> (Proc, String) {
    let mut cmd = Command::new(kt_bin());
    cmd.args(["server", "--listen", &format!("{IP}:0"), "--data-dir"])
        .arg(data)
        .env("RUST_LOG", "warn");
    let proc = spawn_ready(cmd);
    let addr = proc.addr.clone();
    (proc, addr)
}

fn mount_source(path: &Path) -> Option<String> {
    mount_helper::spawn::mounted_at(path).map(|(_, source)| source)
}

/// Unmounts whatever this test left and stops the `kt mount` it started.
struct Cleanup {
    mountpoint: PathBuf,
    pid: Option<u32>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // The `kt mount` this test started through mount.kt.
        if let Some(pid) = self.pid {
            test_support::terminate(pid, Duration::from_secs(10));
        }
        if mount_source(&self.mountpoint).is_some() {
            lazy_umount(&self.mountpoint);
        }
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("run")
}

#[test]
fn mount_write_read_and_umount_for_real() {
    require_fuse();
    let tmp = tempfile::tempdir().unwrap();
    let (_server, addr) = start_server(&tmp.path().join("store"));
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mnt = mnt.canonicalize().unwrap();
    let cache = tmp.path().join("cache");
    let sock = tmp.path().join("agent.sock");
    let helper = mount_kt(tmp.path());
    let opts = format!(
        "cache_dir={},cache_size=256M,namespace=mh-test,node_id=mh1,listen={IP}:0,socket={},\
         kt={},defaults,_netdev,noatime,x-systemd.automount",
        cache.display(),
        sock.display(),
        kt_bin().display()
    );
    let mut cleanup = Cleanup {
        mountpoint: mnt.clone(),
        pid: None,
    };

    // -f: everything but the mount.
    let out = run(Command::new(&helper).args([&addr, mnt.to_str().unwrap(), "-f", "-o", &opts]));
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--namespace mh-test"));
    assert!(mount_source(&mnt).is_none());

    // The real thing, as mount(8) calls it.
    let out =
        run(Command::new(&helper).args([addr.as_str(), mnt.to_str().unwrap(), "-v", "-o", &opts]));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "mount.kt failed: {stderr}");
    let pid: u32 = stderr
        .split("kt pid ")
        .nth(1)
        .and_then(|r| r.split([',', ' ', ')']).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {stderr:?}"));
    cleanup.pid = Some(pid);
    assert!(alive(pid));
    // Ready when mount.kt returns: no waiting here.
    assert_eq!(mount_source(&mnt).as_deref(), Some("ktfs:mh-test"));

    std::fs::create_dir(mnt.join("dir")).unwrap();
    std::fs::write(mnt.join("dir/hello.txt"), b"hello through mount.kt\n").unwrap();
    assert_eq!(
        std::fs::read(mnt.join("dir/hello.txt")).unwrap(),
        b"hello through mount.kt\n"
    );
    // The file is a key of the namespace on the store server.
    let ls = run(Command::new(kt_bin())
        .args(["ls", "-n", "mh-test", "dir", "--json", "--server", &addr])
        .env("KT_AGENT", tmp.path().join("none.sock")));
    assert!(ls.status.success(), "{ls:?}");
    assert!(String::from_utf8_lossy(&ls.stdout).contains("hello.txt"));
    // The log is where the options said.
    assert!(cache.join("kt-mount.log").is_file());

    // Mounting again on the same directory fails cleanly.
    let again = run(Command::new(&helper).args([&addr, mnt.to_str().unwrap(), "-o", &opts]));
    assert_eq!(again.status.code(), Some(32), "{again:?}");
    assert!(String::from_utf8_lossy(&again.stderr).contains("already mounted"));

    // umount ends kt mount.
    let um = run(Command::new("umount").arg(&mnt));
    assert!(um.status.success(), "umount: {um:?}");
    assert!(mount_source(&mnt).is_none());
    assert!(
        eventually(Duration::from_secs(20), || !alive(pid)),
        "kt mount (pid {pid}) still runs after umount"
    );
}

#[test]
fn failures_exit_with_mounts_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let helper = mount_kt(tmp.path());
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let m = mnt.to_str().unwrap();

    // Usage errors: 1.
    for args in [
        vec!["127.0.0.94:1", m, "-o", "colour=red"],
        vec!["127.0.0.94:1"],
        vec!["127.0.0.94:1", m, "-o", "locale=somewhere"],
    ] {
        let out = run(Command::new(&helper).args(&args));
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
    }
    // -s accepts unknown options.
    let out = run(Command::new(&helper).args(["127.0.0.94:1", m, "-sf", "-o", "colour=red"]));
    assert!(out.status.success(), "{out:?}");

    // kt that exits at once: 32, with what it said.
    let fake_kt = tmp.path().join("kt-fails");
    std::fs::write(
        &fake_kt,
        "#!/bin/sh\necho 'kt: error: cannot mount here' >&2\nexit 3\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &fake_kt,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let opts = format!(
        "cache_dir={},kt={}",
        tmp.path().join("cache").display(),
        fake_kt.display()
    );
    let out = run(Command::new(&helper).args(["127.0.0.94:1", m, "-o", &opts]));
    assert_eq!(out.status.code(), Some(32), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot mount here"));

    // A mount point that does not exist: 32.
    let out = run(Command::new(&helper).args([
        "127.0.0.94:1",
        tmp.path().join("missing").to_str().unwrap(),
        "-o",
        &opts,
    ]));
    assert_eq!(out.status.code(), Some(32), "{out:?}");
}
