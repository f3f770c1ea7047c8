//! The `kt` binary: where it is, and the CLI calls kt-csi makes with it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
pub enum KtError {
    #[error("running {kt}: {source}")]
    Spawn {
        kt: String,
        #[source]
        source: std::io::Error,
    },
    #[error("kt {args}: {stderr}")]
    Failed { args: String, stderr: String },
}

/// `kt` next to the running executable, else the first `kt` on `PATH`, else plain `kt` (which
/// then fails with a clear error when first used).
pub fn find_kt() -> PathBuf {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("kt")))
        .filter(|p| is_executable(p));
    beside
        .or_else(|| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join("kt"))
                    .find(|p| is_executable(p))
            })
        })
        .unwrap_or_else(|| PathBuf::from("kt"))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Removes key `prefix` of namespace `ns` and every key below it (`kt rm PREFIX --recursive`).
/// Returns `false` when there was nothing to remove.
pub fn remove_tree(kt: &Path, server: &str, ns: &str, prefix: &str) -> Result<bool, KtError> {
    // `--` first: a key may start with '-'.
    let args = [
        "rm",
        "--recursive",
        "-n",
        ns,
        "--server",
        server,
        "--",
        prefix,
    ];
    let out = Command::new(kt)
        .args(args)
        .env_remove("KT_NAMESPACE")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .map_err(|source| KtError::Spawn {
            kt: kt.display().to_string(),
            source,
        })?;
    if out.status.success() {
        return Ok(true);
    }
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    // The store answers NOT_FOUND with "key PREFIX not found".
    if stderr.contains(&format!("key {prefix} not found")) {
        return Ok(false);
    }
    Err(KtError::Failed {
        args: args.join(" "),
        stderr,
    })
}
