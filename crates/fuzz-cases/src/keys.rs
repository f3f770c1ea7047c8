//! Keys, prefixes and namespaces as users and peers give them.

use ktfs::key::{KeyPath, Namespace, MAX_KEY, MAX_SEGMENT, RESERVED};

/// The bytes as text (lossily); a first line break splits them into a key and a relative path
/// to join onto it. What parses is clean and a fixed point; the other forms agree with it.
pub fn keys(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    let text: &str = &text;
    let (raw, rel) = text.split_once('\n').unwrap_or((text, ""));
    let parsed = KeyPath::parse(raw);
    if let Ok(k) = &parsed {
        clean(k);
        let again = KeyPath::parse(k.as_str()).expect("a clean key parses again");
        assert_eq!(&again, k);
        let dressed = KeyPath::parse(&format!("/{}/", k.as_str())).expect("/KEY/ is KEY");
        assert_eq!(&dressed, k);
        assert_eq!(k.segments().last(), Some(k.name()));
        assert_eq!(k.segments().collect::<Vec<_>>().join("/"), k.as_str());
        if let Ok(j) = k.join(rel) {
            clean(&j);
            if rel.is_empty() {
                assert_eq!(&j, k);
            } else {
                let under = format!("{}/", k.as_str());
                assert!(j.as_str().starts_with(&under), "{j} is not below {k}");
            }
        }
    }
    match KeyPath::parse_prefix(raw) {
        Ok(None) => assert!(raw.is_empty() || raw == "/", "{raw:?} taken for the root"),
        Ok(Some(p)) => assert_eq!(Ok(p), parsed, "a prefix parsed unlike a key"),
        Err(e) => assert_eq!(Err(e), parsed, "a prefix refused unlike a key"),
    }
    for ns in [raw, rel] {
        let ok = rfc1123_label(ns);
        match Namespace::parse(ns) {
            Ok(n) => {
                assert!(ok, "namespace {ns:?} accepted");
                assert_eq!(n.as_str(), ns);
            }
            Err(_) => assert!(!ok, "namespace {ns:?} refused"),
        }
    }
}

fn clean(k: &KeyPath) {
    let s = k.as_str();
    assert!(!s.is_empty() && s.len() <= MAX_KEY, "{s:?}: length");
    assert!(!s.starts_with('/') && !s.ends_with('/'), "{s:?}: slashes");
    assert!(!s.contains('\0'), "{s:?}: NUL");
    assert_ne!(s.split('/').next(), Some(RESERVED), "{s:?}: reserved");
    for seg in s.split('/') {
        assert!(
            !seg.is_empty() && seg != "." && seg != ".." && seg.len() <= MAX_SEGMENT,
            "{s:?}: segment {seg:?}"
        );
    }
}

/// A Kubernetes namespace name, written from its definition.
fn rfc1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&b.len())
        && b.iter().all(|c| alnum(c) || *c == b'-')
        && alnum(&b[0])
        && alnum(&b[b.len() - 1])
}
