//! Publishing a volume on this node: the namespace's shared mount (see [`crate::agents`]), the
//! prefix directory inside it, and a bind mount of that directory on the pod's target path
//! (remounted read-only for a read-only publish).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::agents::{AgentError, Agents};
use crate::mounts::{self, MountError, Probe};
use crate::volume::{Locale, VolumeSpec};

/// The xattr that sets the default locale of files written below a directory of a ktfs mount.
pub const LOCALE_XATTR: &str = "user.kt.locale";
const RESPONSE_LIMIT: Duration = Duration::from_secs(5);
/// Bound on mounts stacked on one target that an unpublish takes down.
const MAX_STACKED: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{target} already holds another mount ({existing})")]
    Incompatible { target: PathBuf, existing: String },
    #[error("the volume at {0} does not respond")]
    Hung(PathBuf),
    #[error("{0} is a file in the store, not a directory; it cannot be mounted as a volume")]
    NotDirectory(String),
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PublishError {
    let path = path.to_path_buf();
    move |source| PublishError::Io { what, path, source }
}

/// Mounts volume `spec` at `target` (created if missing). Publishing the same volume again on
/// the same target is a no-op; a different mount there is [`PublishError::Incompatible`].
/// Blocking.
pub fn publish(
    agents: &Agents,
    spec: &VolumeSpec,
    target: &Path,
    readonly: bool,
) -> Result<(), PublishError> {
    let target = mounts::normalize(target);
    let ns_mount = agents.ensure(&spec.namespace, spec.stale_reads)?;
    if let Some(existing) = mounts::lookup(&target)? {
        let same = existing.is_ktfs(&spec.namespace)
            && existing.root == Path::new("/").join(&spec.prefix)
            && existing.read_only() == readonly;
        if !same {
            return Err(PublishError::Incompatible {
                target,
                existing: format!(
                    "{} {} of {}{}",
                    existing.fstype,
                    existing.source,
                    existing.root.display(),
                    if existing.read_only() { ", ro" } else { "" }
                ),
            });
        }
        match mounts::probe(&target, RESPONSE_LIMIT) {
            Probe::Answers => return Ok(()),
            Probe::Hangs => return Err(PublishError::Hung(target)),
            // A bind of a namespace mount whose agent died: replace it.
            Probe::Fails(e) => {
                tracing::warn!(target = %target.display(), error = %e,
                    "replacing a dead volume mount");
                mounts::detach(&target)?;
            }
        }
    }
    let source = ns_mount.join(&spec.prefix);
    std::fs::create_dir_all(&source).map_err(io("creating", &source))?;
    if !source.is_dir() {
        return Err(PublishError::NotDirectory(spec.prefix.clone()));
    }
    if !readonly {
        set_locale(&source, spec.locale)?;
    }
    std::fs::create_dir_all(&target).map_err(io("creating", &target))?;
    mounts::bind(&source, &target)?;
    if readonly {
        if let Err(e) = mounts::remount_read_only(&target) {
            let _ = mounts::detach(&target);
            return Err(e.into());
        }
    }
    tracing::info!(volume = spec.id(), target = %target.display(), readonly, "published");
    Ok(())
}

/// Unmounts `target` (every mount stacked there) and removes the directory. A target that is
/// not mounted, or does not exist, is fine. Blocking.
pub fn unpublish(target: &Path) -> Result<(), PublishError> {
    let target = mounts::normalize(target);
    for _ in 0..MAX_STACKED {
        if mounts::lookup(&target)?.is_none() {
            break;
        }
        mounts::unmount(&target)?;
    }
    match std::fs::remove_dir(&target) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            std::fs::remove_file(&target).map_err(io("removing", &target))?
        }
        Err(e) => return Err(io("removing", &target)(e)),
    }
    tracing::info!(target = %target.display(), "unpublished");
    Ok(())
}

/// Sets the default locale of files written below `dir` (kept by the namespace's agent).
fn set_locale(dir: &Path, locale: Locale) -> Result<(), PublishError> {
    let (Some(path), Ok(name)) = (mounts::c_path(dir), std::ffi::CString::new(LOCALE_XATTR)) else {
        return Err(io("setting the locale of", dir)(std::io::Error::from(
            std::io::ErrorKind::InvalidInput,
        )));
    };
    let value = locale.as_str().as_bytes();
    // SAFETY: valid C strings and a buffer of the given length.
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc != 0 {
        return Err(io("setting the locale of", dir)(
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}
