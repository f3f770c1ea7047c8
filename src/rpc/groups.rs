//! The names of broadcast windows, as every client and the store server derive them.

use crate::hash::Version;

/// The group of a window given no explicit id: the same for every participant of one key.
/// The window of a GPU key's participants that name no group: one per key, apart from the
/// key's file window.
pub fn default_gpu_group(namespace: &str, key: &str) -> String {
    let h = blake3::hash(format!("gpu\0{namespace}\0{key}").as_bytes());
    format!("g-{}", &h.to_hex()[..16])
}

pub fn default_group(namespace: &str, key: &str) -> String {
    let h = blake3::hash(format!("{namespace}\0{key}").as_bytes());
    format!("k-{}", &h.to_hex()[..16])
}

/// A window's group as the server keys it: inside its namespace, so that two namespaces that
/// name the same group, or hold the same version, never share a window. A group scoped once
/// stays as it is, so a client may hand back the group a window answered with.
pub fn scope_group(ns: &str, group: &str) -> String {
    match group.strip_prefix(ns).and_then(|g| g.strip_prefix('/')) {
        Some(_) => group.to_string(),
        None => format!("{ns}/{group}"),
    }
}

/// The implicit window of getters that gave no window settings.
pub fn implicit_group(version: &Version) -> String {
    format!("v-{}", &version.hex()[..16])
}

#[cfg(test)]
mod tests {
    use super::scope_group;

    #[test]
    fn groups_are_scoped_once() {
        assert_eq!(scope_group("team-a", "g"), "team-a/g");
        assert_eq!(scope_group("team-a", "team-a/g"), "team-a/g");
        assert_eq!(scope_group("team-a", "team-b/g"), "team-a/team-b/g");
    }
}
