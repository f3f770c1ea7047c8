//! Writing large buffers into files in pieces of at most [`PIECE`] bytes.
//!
//! The kernel sizes the page-cache folios of a buffered write by the size of the write. Writes
//! of 2 MiB and more get huge folios, and on a VM whose free huge pages have been handed back
//! to the host (virtio-balloon free page reporting) each one costs host faults: measured here,
//! `dd bs=4M` of 1 GiB into the page cache took 0.5-2.5 s of system time and `bs=2M` 3.1-3.4 s,
//! while `bs=1M` took 0.29-0.37 s and `bs=512K` 0.29-0.36 s, run after run. On other machines
//! the pieces cost one system call per MiB, nothing measurable.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;

/// Largest single write into the page cache.
pub const PIECE: usize = 1 << 20;

/// `write_all_at` in pieces.
pub fn write_all_at(file: &File, data: &[u8], offset: u64) -> io::Result<()> {
    let mut at = offset;
    for piece in data.chunks(PIECE) {
        file.write_all_at(piece, at)?;
        at += piece.len() as u64;
    }
    Ok(())
}

/// `write_all` in pieces.
pub fn write_all(mut w: impl Write, data: &[u8]) -> io::Result<()> {
    data.chunks(PIECE).try_for_each(|piece| w.write_all(piece))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_land_where_one_write_would() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(PIECE * 3 + 12345)).map(|i| (i % 251) as u8).collect();
        let at = dir.path().join("at");
        let f = File::create(&at).unwrap();
        write_all_at(&f, &data, 7).unwrap();
        let seq = dir.path().join("seq");
        write_all(File::create(&seq).unwrap(), &data).unwrap();
        let got = std::fs::read(&at).unwrap();
        assert_eq!(got.len(), data.len() + 7);
        assert_eq!(&got[..7], &[0; 7]);
        assert_eq!(&got[7..], &data[..]);
        assert_eq!(std::fs::read(&seq).unwrap(), data);
    }
}
