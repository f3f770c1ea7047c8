//! A real S3 server for the tests of cluster mode's object store: `s3s-fs` (the s3s project's
//! S3 service over a directory, which the test command installs with `cargo install`), on a
//! loopback address, its objects in a temporary directory, with credentials of its own.

use std::path::Path;
use std::process::Command;

use crate::{spawn_until, Proc, Stream};

/// What s3s-fs logs once it listens.
const SERVING: &str = "server is running at";
pub const ACCESS_KEY: &str = "kt-test-access";
pub const SECRET_KEY: &str = "kt-test-secret";

pub struct S3 {
    pub proc: Proc,
    /// `http://HOST:PORT`.
    pub endpoint: String,
    root: tempfile::TempDir,
}

impl S3 {
    /// A server on `ip`, port 9000, with `bucket` made.
    pub fn start(ip: &str, bucket: &str) -> S3 {
        let root = tempfile::tempdir().expect("the S3 server's directory");
        std::fs::create_dir(root.path().join(bucket)).expect("the bucket");
        let mut cmd = Command::new("s3s-fs");
        cmd.args(["--host", ip, "--port", "9000"])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root.path())
            .env("RUST_LOG", "s3s_fs=info");
        S3 {
            proc: spawn_until(cmd, Stream::Stdout, SERVING),
            endpoint: format!("http://{ip}:9000"),
            root,
        }
    }

    /// The address a store is given: `s3://BUCKET/PREFIX?endpoint=...&region=...`.
    pub fn url(&self, bucket: &str, prefix: &str) -> String {
        format!(
            "s3://{bucket}/{prefix}?endpoint={}&region=us-east-1",
            self.endpoint
        )
    }

    /// The environment a client of the server needs: its credentials.
    pub fn env(&self) -> [(&'static str, &'static str); 2] {
        [
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ]
    }

    /// Where the server keeps its objects (a bucket is a directory of it).
    pub fn root(&self) -> &Path {
        self.root.path()
    }
}
