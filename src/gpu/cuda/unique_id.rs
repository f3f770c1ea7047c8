//! The id that the ranks of one NCCL communicator share, made by one of them and handed to the
//! others as plain bytes.

use std::ffi::c_char;

use cudarc::nccl::sys;

use super::nccl_error::{require_nccl, status, NcclError};

/// The size of an NCCL unique id.
pub const UNIQUE_ID_BYTES: usize = 128;

/// The id all ranks of one communicator share: made by one of them ([`UniqueId::new`]), sent
/// to the others over any channel (it is plain bytes), used once.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId([u8; UNIQUE_ID_BYTES]);

impl UniqueId {
    /// A fresh id. NCCL starts its bootstrap listener in this process, which must live until
    /// every rank has joined.
    pub fn new() -> Result<UniqueId, NcclError> {
        require_nccl()?;
        let mut raw = sys::ncclUniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: the probe found the symbol; `raw` outlives the call.
        let r = unsafe { sys::ncclGetUniqueId(&mut raw) };
        status(r, "ncclGetUniqueId", std::ptr::null_mut())?;
        Ok(UniqueId(raw.internal.map(|b| b as u8)))
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId, NcclError> {
        let id = bytes.try_into().map_err(|_| {
            NcclError::Invalid(format!(
                "an NCCL unique id is {UNIQUE_ID_BYTES} bytes, not {}",
                bytes.len()
            ))
        })?;
        Ok(UniqueId(id))
    }

    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.0
    }

    /// Lower-case hex, for a command line, a file or an environment variable.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(hex: &str) -> Result<UniqueId, NcclError> {
        let bad = || NcclError::Invalid(format!("{hex:?} is not an NCCL unique id in hex"));
        let hex = hex.trim();
        if hex.len() != 2 * UNIQUE_ID_BYTES || !hex.is_ascii() {
            return Err(bad());
        }
        let bytes = (0..UNIQUE_ID_BYTES)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad()))
            .collect::<Result<Vec<u8>, _>>()?;
        UniqueId::from_bytes(&bytes)
    }

    pub(super) fn raw(&self) -> sys::ncclUniqueId {
        sys::ncclUniqueId {
            internal: self.0.map(|b| b as c_char),
        }
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({}..)", &self.to_hex()[..16])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unique_id_round_trips_through_bytes_and_hex() {
        let bytes: Vec<u8> = (0..UNIQUE_ID_BYTES).map(|i| (i * 37 % 256) as u8).collect();
        let id = UniqueId::from_bytes(&bytes).unwrap();
        assert_eq!(id.as_bytes().as_slice(), bytes.as_slice());
        assert_eq!(UniqueId::from_bytes(id.as_bytes()).unwrap(), id);
        let hex = id.to_hex();
        assert_eq!(hex.len(), 256);
        assert_eq!(UniqueId::from_hex(&format!("{hex}\n")).unwrap(), id);
        // The raw form NCCL takes holds the same bytes.
        assert_eq!(id.raw().internal.map(|b| b as u8), *id.as_bytes());
        assert!(UniqueId::from_bytes(&bytes[1..]).is_err());
        assert!(UniqueId::from_hex(&hex[2..]).is_err());
        assert!(UniqueId::from_hex(&"zz".repeat(128)).is_err());
        assert!(UniqueId::from_hex(&"é".repeat(128)).is_err());
    }
}
