//! Paths of the mount: keys of its namespace, `""` for its root, `/`-separated.

use crate::gpu::CONTROL_DIR;
use crate::key::KeyPath;

use super::error::{FsError, FsResult};

pub(crate) fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_string()
    } else {
        format!("{parent}/{name}")
    }
}

pub(crate) fn split(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => ("", path),
    }
}

/// Whether `path` is `prefix` or below it.
pub(crate) fn under(path: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The key below `/.gpu` that `path` names: `Some("")` for `.gpu` itself.
pub(crate) fn gpu_rest(path: &str) -> Option<&str> {
    if path == CONTROL_DIR {
        Some("")
    } else {
        path.strip_prefix(CONTROL_DIR)?.strip_prefix('/')
    }
}

/// Checks a path that is about to become a key.
pub(crate) fn check_key(path: &str) -> FsResult<()> {
    KeyPath::parse(path).map(|_| ()).map_err(FsError::Name)
}
