//! Publishing by patch: `kt put` onto a key it put before sends the differences from the key's
//! current version instead of the whole manifest, so an unchanged tree costs a few bytes and a
//! one-file edit one entry. The server rebuilds the manifest from the version it holds and
//! checks it is the version the patch names.

use crate::hash::Version;
use crate::key::{KeyPath, Namespace};
use crate::manifest::{self, Manifest, ManifestPatch};
use crate::meta::{Loc, MetaError, MetaStore, View};
use crate::proto::{EntryKind, Locale};

/// What a patch publish comes to.
pub(super) enum Patched {
    /// The manifest to publish, and the version it patched if the store holds its blocks
    /// (checked when it was published; a `locale=local` version's are on its origin).
    Publish {
        manifest: Manifest,
        base: Option<Manifest>,
    },
    /// The key already is this version, as the same kind of publication would leave it:
    /// nothing to write (an unchanged tree put again changes nothing, its times included).
    Unchanged(Version),
}

/// The manifest `patch` makes of `key`'s current version, which must be `base`; a key that
/// moved on, or a base that is not a key (a path inside a directory), is a conflict, and the
/// client sends its whole manifest instead.
pub(super) fn patched(
    meta: &MetaStore,
    ns: &Namespace,
    key: &KeyPath,
    base: &[u8],
    patch: &ManifestPatch,
    locale: Locale,
    ttl_secs: u64,
) -> Result<Patched, MetaError> {
    let moved = || MetaError::Conflict(format!("{key} is no longer the version the put patches"));
    // An unchanged tree (the common case of a put run again) needs the key's record alone,
    // not its manifest.
    if manifest::is_empty_patch(patch) && patch.version == base && ttl_secs == 0 {
        let record = match meta.locate(ns, key)? {
            Loc::Key { record } if record.version == base => record,
            _ => return Err(moved()),
        };
        let same_kind = record.locale() == locale
            && record.expires_unix_ms == 0
            && record.kind() != EntryKind::Gpu;
        // A directory's put replaces what is below it, keys published there since included.
        let alone = !record.is_directory
            || !meta.any_descendant(View::Stored, ns, key.as_str(), |_| false)?;
        if same_kind && alone {
            let v =
                Version::from_slice(base).ok_or_else(|| MetaError::Corrupt("version".into()))?;
            return Ok(Patched::Unchanged(v));
        }
    }
    let r = match meta.resolve(ns, key) {
        Ok(r) => r,
        Err(MetaError::NotFound(_)) => return Err(moved()),
        Err(e) => return Err(e),
    };
    if !r.subpath.is_empty() || r.record.version != base || r.record.kind() == EntryKind::Gpu {
        return Err(moved());
    }
    Ok(Patched::Publish {
        manifest: manifest::apply(&r.manifest, patch)?,
        base: (r.record.locale() == Locale::Store).then_some(r.manifest),
    })
}
