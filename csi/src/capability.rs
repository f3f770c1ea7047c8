//! Which volume capabilities ktfs supports: a mounted filesystem (no block device), in every
//! access mode, single- or multi-node, read-only or read-write.

use crate::proto::volume_capability::access_mode::Mode;
use crate::proto::volume_capability::AccessType;
use crate::proto::VolumeCapability;

/// File system types a request may name for a ktfs volume (empty: unspecified).
const FS_TYPES: [&str; 5] = ["", "kt", "ktfs", "fuse", "fuse.kt"];

/// `Err(reason)` when ktfs cannot serve `cap`.
pub fn check(cap: &VolumeCapability) -> Result<(), String> {
    match &cap.access_type {
        Some(AccessType::Mount(m)) => {
            if !FS_TYPES.contains(&m.fs_type.as_str()) {
                return Err(format!(
                    "fs_type {:?} is not supported: ktfs volumes are ktfs (or unspecified)",
                    m.fs_type
                ));
            }
        }
        Some(AccessType::Block(_)) => {
            return Err("block volumes are not supported: ktfs is a filesystem".into())
        }
        None => return Err("the volume capability has no access type".into()),
    }
    let mode = cap
        .access_mode
        .as_ref()
        .ok_or("the volume capability has no access mode")?
        .mode;
    match Mode::try_from(mode) {
        Ok(Mode::Unknown) | Err(_) => Err(format!("access mode {mode} is not supported")),
        Ok(_) => Ok(()),
    }
}

/// Checks every capability; a missing list is an error too.
pub fn check_all(caps: &[VolumeCapability]) -> Result<(), String> {
    if caps.is_empty() {
        return Err("volume capabilities are required".into());
    }
    caps.iter().try_for_each(check)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::volume_capability::{AccessMode, BlockVolume, MountVolume};

    fn cap(access: Option<AccessType>, mode: Option<Mode>) -> VolumeCapability {
        VolumeCapability {
            access_type: access,
            access_mode: mode.map(|m| AccessMode { mode: m as i32 }),
        }
    }

    fn mount(fs: &str) -> Option<AccessType> {
        Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn filesystem_modes_pass_and_the_rest_fails() {
        for m in [
            Mode::SingleNodeWriter,
            Mode::SingleNodeReaderOnly,
            Mode::MultiNodeReaderOnly,
            Mode::MultiNodeSingleWriter,
            Mode::MultiNodeMultiWriter,
            Mode::SingleNodeSingleWriter,
            Mode::SingleNodeMultiWriter,
        ] {
            assert_eq!(check(&cap(mount(""), Some(m))), Ok(()));
        }
        assert!(check(&cap(
            Some(AccessType::Block(BlockVolume {})),
            Some(Mode::SingleNodeWriter)
        ))
        .is_err());
        assert!(check(&cap(mount("ext4"), Some(Mode::SingleNodeWriter))).is_err());
        assert!(check(&cap(None, Some(Mode::SingleNodeWriter))).is_err());
        assert!(check(&cap(mount(""), None)).is_err());
        assert!(check(&cap(mount(""), Some(Mode::Unknown))).is_err());
        assert!(check_all(&[]).is_err());
    }
}
