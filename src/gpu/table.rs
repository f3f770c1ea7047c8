//! The tensor table of a GPU key: its entries' names, dtypes and shapes, as a publisher writes
//! it to its control file and every participant of a window checks it against the publisher's
//! (by [`Table::digest`]) before any byte moves.
//!
//! On the wire and in the control file it is JSON: `{"entries": [{"name": "layer1.weight",
//! "dtype": "float32", "shape": [1000, 1000]}, ...]}`. Each entry's size follows from its dtype
//! and shape; an entry's buffer must be exactly that size.

use serde::{Deserialize, Serialize};

use crate::hash::BlockHash;

/// Most entries one key may carry.
pub const MAX_ENTRIES: usize = 100_000;
/// Most bytes of a table's JSON.
pub const MAX_TABLE_BYTES: usize = 16 << 20;
/// Longest entry name.
pub const MAX_NAME: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Table {
    pub entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error("the tensor table is not valid JSON: {0}")]
    Json(String),
    #[error("the tensor table is larger than {MAX_TABLE_BYTES} bytes")]
    TooLarge,
    #[error("the tensor table has {0} entries, at most {MAX_ENTRIES}")]
    TooMany(usize),
    #[error("entry {0}: a name must be 1 to {MAX_NAME} bytes without NUL")]
    BadName(usize),
    #[error("entry {0:?} appears twice")]
    Duplicate(String),
    #[error("entry {name:?}: unknown dtype {dtype:?}")]
    Dtype { name: String, dtype: String },
    #[error("entry {0:?}: its shape's size overflows")]
    Overflow(String),
}

/// Bytes per element of a dtype (torch's and numpy's names).
pub fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "bool" | "int8" | "uint8" | "float8_e4m3fn" | "float8_e5m2" => 1,
        "float16" | "bfloat16" | "int16" | "uint16" => 2,
        "float32" | "int32" | "uint32" => 4,
        "float64" | "int64" | "uint64" | "complex64" => 8,
        "complex128" => 16,
        _ => return None,
    })
}

impl Entry {
    /// The entry's size in bytes (checked by [`Table::parse`]).
    pub fn nbytes(&self) -> u64 {
        let elems = self.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        elems
            .and_then(|n| n.checked_mul(dtype_size(&self.dtype)?))
            .unwrap_or(u64::MAX)
    }
}

impl Table {
    /// Parses and checks a table a caller wrote.
    pub fn parse(json: &[u8]) -> Result<Table, TableError> {
        if json.len() > MAX_TABLE_BYTES {
            return Err(TableError::TooLarge);
        }
        let t: Table = serde_json::from_slice(json).map_err(|e| TableError::Json(e.to_string()))?;
        t.check()?;
        Ok(t)
    }

    fn check(&self) -> Result<(), TableError> {
        if self.entries.len() > MAX_ENTRIES {
            return Err(TableError::TooMany(self.entries.len()));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, e) in self.entries.iter().enumerate() {
            if e.name.is_empty() || e.name.len() > MAX_NAME || e.name.contains('\0') {
                return Err(TableError::BadName(i));
            }
            if !seen.insert(e.name.as_str()) {
                return Err(TableError::Duplicate(e.name.clone()));
            }
            let Some(size) = dtype_size(&e.dtype) else {
                return Err(TableError::Dtype {
                    name: e.name.clone(),
                    dtype: e.dtype.clone(),
                });
            };
            let elems = e.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            if elems.and_then(|n| n.checked_mul(size)).is_none() {
                return Err(TableError::Overflow(e.name.clone()));
            }
        }
        Ok(())
    }

    /// Bytes of every entry.
    pub fn nbytes(&self) -> u64 {
        self.entries.iter().map(Entry::nbytes).sum()
    }

    /// What every participant's table must match: names, dtypes and shapes, in order.
    pub fn digest(&self) -> BlockHash {
        let mut h = blake3::Hasher::new();
        for e in &self.entries {
            h.update(&(e.name.len() as u64).to_le_bytes());
            h.update(e.name.as_bytes());
            h.update(&(e.dtype.len() as u64).to_le_bytes());
            h.update(e.dtype.as_bytes());
            h.update(&(e.shape.len() as u64).to_le_bytes());
            for d in &e.shape {
                h.update(&d.to_le_bytes());
            }
        }
        BlockHash(*h.finalize().as_bytes())
    }

    /// The first difference from `other`, said for a person: what a mismatch error reports.
    pub fn difference(&self, other: &Table) -> Option<String> {
        if self.entries.len() != other.entries.len() {
            return Some(format!(
                "{} entries, the publisher's table has {}",
                self.entries.len(),
                other.entries.len()
            ));
        }
        self.entries
            .iter()
            .zip(&other.entries)
            .find(|(a, b)| a != b)
            .map(|(a, b)| {
                format!(
                    "entry {:?} is {} {:?}, the publisher's {:?} is {} {:?}",
                    a.name, a.dtype, a.shape, b.name, b.dtype, b.shape
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_checked_sized_and_compared() {
        let t = Table::parse(
            br#"{"entries": [{"name": "w", "dtype": "float32", "shape": [2, 3]},
                             {"name": "b", "dtype": "bfloat16", "shape": [3]},
                             {"name": "s", "dtype": "int64", "shape": []}]}"#,
        )
        .unwrap();
        assert_eq!(
            t.entries.iter().map(Entry::nbytes).collect::<Vec<_>>(),
            [24, 6, 8]
        );
        assert_eq!(t.nbytes(), 38);
        let mut other = t.clone();
        assert_eq!(t.digest(), other.digest());
        other.entries[1].shape = vec![4];
        assert_ne!(t.digest(), other.digest());
        assert!(t.difference(&other).unwrap().contains("\"b\""));
        assert!(matches!(
            Table::parse(br#"{"entries": [{"name": "x", "dtype": "float7", "shape": [1]}]}"#),
            Err(TableError::Dtype { .. })
        ));
        assert!(matches!(
            Table::parse(
                br#"{"entries": [{"name": "x", "dtype": "int8", "shape": [1]}, {"name": "x", "dtype": "int8", "shape": [1]}]}"#
            ),
            Err(TableError::Duplicate(_))
        ));
        assert!(matches!(
            Table::parse(
                br#"{"entries": [{"name": "x", "dtype": "float64", "shape": [4294967296, 4294967296]}]}"#
            ),
            Err(TableError::Overflow(_))
        ));
        assert!(matches!(
            Table::parse(b"not json"),
            Err(TableError::Json(_))
        ));
    }
}
