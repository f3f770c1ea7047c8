//! Fields of `/proc/self/mountinfo` (proc(5)): space-separated, with the octal escapes the
//! kernel writes for the bytes that would break a line apart.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

/// Decodes the octal escapes (`\040` for a space, `\011`, `\012`, `\134`) of a mountinfo
/// field. A backslash not followed by three octal digits of one byte stays as it is.
pub fn unescape(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            if let Some(byte) = b.get(i + 1..i + 4).and_then(octal_byte) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(OsString::from_vec(out))
}

fn octal_byte(digits: &[u8]) -> Option<u8> {
    if !digits.iter().all(|c| (b'0'..=b'7').contains(c)) {
        return None;
    }
    let v = digits
        .iter()
        .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
    u8::try_from(v).ok()
}

#[cfg(test)]
mod tests {
    use super::unescape;
    use std::path::Path;

    #[test]
    fn escapes_decode_and_anything_else_stays() {
        assert_eq!(
            unescape(r"/a\040b\011c\012d\134e"),
            Path::new("/a b\tc\nd\\e")
        );
        // Too short at the end, not octal, or past one byte: left alone.
        assert_eq!(unescape(r"/x\04"), Path::new(r"/x\04"));
        assert_eq!(unescape(r"/x\089"), Path::new(r"/x\089"));
        assert_eq!(unescape(r"/x\777"), Path::new(r"/x\777"));
        assert_eq!(unescape(r"\040"), Path::new(" "));
    }
}
