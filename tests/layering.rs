//! The layering of `src/`: every `crate::…` path in a top-level module (in `use` lines and
//! inline, grouped `crate::{a, b}` too) must point at a module that module may depend on.
//! Dependencies only point down:
//!
//! ```text
//! cli (the binary) -> agent -> fs -> transfer -> blocks -> data model
//!                     server -> meta, broadcast, transfer, blocks -> data model
//! ```
//!
//! with `rpc` (the control plane both ends share) and `keeper` beside the layers that use them.
//! A new module, or a new kind of edge, is added to [`ALLOWED`] on purpose, never by accident.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The data model and the primitives everything may use.
const DATA_MODEL: &[&str] = &[
    "proto", "hash", "key", "manifest", "clock", "locks", "metrics", "db", "tls",
];

/// Each top-level module and what it may import besides the data model (which imports only
/// itself, downwards: see [`DATA_MODEL_EDGES`]).
const ALLOWED: &[(&str, &[&str])] = &[
    ("blocks", &[]),
    ("rpc", &[]),
    ("swarm", &[]),
    ("k8s", &[]),
    ("keeper", &[]),
    ("gpu", &["rpc"]),
    ("broadcast", &["rpc", "swarm"]),
    ("meta", &["blocks", "gpu"]),
    ("transfer", &["blocks", "rpc", "swarm"]),
    ("fs", &["blocks", "rpc", "transfer", "keeper", "gpu"]),
    ("agent", &["blocks", "rpc", "transfer", "fs", "keeper"]),
    (
        "server",
        &[
            "blocks",
            "rpc",
            "transfer",
            "meta",
            "broadcast",
            "swarm",
            "k8s",
        ],
    ),
];

/// Within the data model.
const DATA_MODEL_EDGES: &[(&str, &[&str])] = &[
    ("proto", &[]),
    ("hash", &[]),
    ("key", &[]),
    ("locks", &[]),
    ("tls", &[]),
    ("metrics", &["locks"]),
    ("db", &["locks"]),
    ("clock", &["locks"]),
    ("manifest", &["hash", "key", "proto"]),
];

/// The binary's own modules (`src/main.rs`, `src/cli/`): they use the library as `ktfs::…`,
/// and `crate::…` there names only themselves.
const BINARY: &[&str] = &["main", "cli"];

fn allowed(from: &str) -> Option<Vec<&'static str>> {
    if let Some((_, to)) = DATA_MODEL_EDGES.iter().find(|(m, _)| *m == from) {
        return Some(to.to_vec());
    }
    let (_, to) = ALLOWED.iter().find(|(m, _)| *m == from)?;
    let mut all = DATA_MODEL.to_vec();
    all.extend_from_slice(to);
    Some(all)
}

/// The source with comments, string and char literals blanked out (lines kept).
fn code_only(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&b, i) {
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match b.get(j) {
                    None => break,
                    Some('"') if (1..=hashes).all(|k| b.get(j + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    _ => j += 1,
                }
            }
            out.extend(b[i..j.min(b.len())].iter().map(|&c| blank(c)));
            i = j;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && (next == Some('\\') || b.get(i + 2) == Some(&'\'')) {
            // A char literal ('x', '\n', '\''); a lifetime ('a) has no closing quote.
            let mut j = i + 1;
            if b.get(j) == Some(&'\\') {
                j += 2;
            } else {
                j += 1;
            }
            while j < b.len() && b[j] != '\'' {
                j += 1;
            }
            out.extend(b[i..(j + 1).min(b.len())].iter().map(|&c| blank(c)));
            i = j + 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(b: &[char], i: usize) -> bool {
    i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_')
}

fn ident_at(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// Every top-level module named by a `crate::` path in `code`, with its line.
fn crate_paths(code: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(pos) = code[from..].find("crate") {
        let at = from + pos;
        from = at + 5;
        let before_ok =
            at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        let rest = code[at + 5..].trim_start();
        if !before_ok || !rest.starts_with("::") {
            continue;
        }
        let line = code[..at].matches('\n').count() + 1;
        let rest = rest[2..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push((line, ident_at(&item)));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            if !ident_at(&item).is_empty() {
                out.push((line, ident_at(&item)));
            }
        } else {
            out.push((line, ident_at(rest)));
        }
    }
    out
}

/// `super::` paths that climb out of the file's top-level module (to the crate root): they
/// would name another module without saying `crate::`. `depth` is the file's own depth below
/// the root; inline modules (`mod tests { ... }`) add theirs.
fn escaping_supers(code: &str, depth: usize) -> Vec<usize> {
    let b = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let (mut braces, mut inline): (usize, Vec<usize>) = (0, Vec::new());
    let mut i = 0;
    while i < b.len() {
        let word_start = i == 0 || !ident(b[i - 1]);
        if b[i] == b'{' {
            braces += 1;
        } else if b[i] == b'}' {
            if inline.last() == Some(&braces) {
                inline.pop();
            }
            braces = braces.saturating_sub(1);
        } else if word_start && code[i..].starts_with("mod ") {
            let rest = &code[i + 4..];
            let name = ident_at(rest);
            let after = rest.trim_start()[name.len()..].trim_start();
            if !name.is_empty() && after.starts_with('{') {
                inline.push(braces + 1);
            }
        } else if word_start && code[i..].starts_with("super") {
            let climbs = code[i..]
                .split("::")
                .take_while(|s| s.trim() == "super")
                .count();
            if climbs >= depth + inline.len() && code[i + 5..].trim_start().starts_with("::") {
                out.push(code[..i].matches('\n').count() + 1);
            }
        }
        i += 1;
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module of a file under `src/`, and how deep below the crate root it is.
fn module_of(rel: &Path) -> (String, usize) {
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    let depth = if parts.last().is_some_and(|p| p == "mod") {
        parts.len() - 1
    } else {
        parts.len()
    };
    (parts[0].clone(), depth)
}

fn violations(src_dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src_dir, &mut files);
    files.sort();
    let mut bad = Vec::new();
    let mut seen: BTreeMap<String, ()> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(src_dir).expect("under src");
        let (module, depth) = module_of(rel);
        if module == "lib" {
            continue;
        }
        seen.insert(module.clone(), ());
        let code = code_only(&std::fs::read_to_string(f).expect("read"));
        let shown = Path::new("src").join(rel);
        if BINARY.contains(&module.as_str()) {
            for (line, to) in crate_paths(&code) {
                if !BINARY.contains(&to.as_str()) {
                    bad.push(format!(
                        "{}:{line}: crate::{to} (the binary uses the library as ktfs::{to})",
                        shown.display()
                    ));
                }
            }
            continue;
        }
        let Some(ok) = allowed(&module) else {
            bad.push(format!(
                "{}: module `{module}` has no place in the layering table (tests/layering.rs)",
                shown.display()
            ));
            continue;
        };
        for (line, to) in crate_paths(&code) {
            if to != module && !ok.contains(&to.as_str()) {
                bad.push(format!(
                    "{}:{line}: crate::{to} (`{module}` may import only {})",
                    shown.display(),
                    ok.join(", ")
                ));
            }
        }
        for line in escaping_supers(&code, depth) {
            bad.push(format!(
                "{}:{line}: a super:: path that leaves `{module}` (write crate::… instead)",
                shown.display()
            ));
        }
    }
    // The table names only modules that exist, so it cannot drift from the tree unnoticed.
    for (m, _) in ALLOWED.iter().chain(DATA_MODEL_EDGES) {
        if *m != "proto" && !seen.contains_key(*m) {
            bad.push(format!(
                "the layering table names `{m}`, which src/ does not have"
            ));
        }
    }
    bad
}

#[test]
fn dependencies_point_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let bad = violations(&src);
    assert!(
        bad.is_empty(),
        "imports against the layering:\n  {}",
        bad.join("\n  ")
    );
}

#[test]
fn the_checker_sees_every_form_of_path_and_nothing_in_comments_or_strings() {
    let code = code_only(
        r##"
use crate::hash::BlockHash;
use crate::{fs::FsCore, key,
    rpc::{self, Fault}};
// use crate::agent::Nope;
/* crate::server in a block comment */
let s = "crate::meta in a string";
let r = r#"crate::broadcast in a raw string"#;
let c = '"'; let l: &'static str = "x";
fn f() { crate::transfer::get::get(); }
"##,
    );
    let found: Vec<(usize, String)> = crate_paths(&code);
    let names: Vec<&str> = found.iter().map(|(_, m)| m.as_str()).collect();
    assert_eq!(names, ["hash", "fs", "key", "rpc", "transfer"]);
    assert_eq!(found[1].0, 3);
    assert_eq!(found[4].0, 10);
    // In src/blocks/x.rs (depth 2) one super stays inside blocks, two leave it; a test
    // module's super is its file.
    assert!(escaping_supers("use super::Served;", 2).is_empty());
    assert_eq!(escaping_supers("use super::super::fs::X;", 2), [1]);
    assert!(escaping_supers("mod tests {\n use super::*;\n}\n", 1).is_empty());
    assert_eq!(
        escaping_supers("mod tests {\n use super::*;\n}\nuse super::x;\n", 1),
        [4]
    );
}

#[test]
fn a_forbidden_edge_is_named_with_its_file_and_path() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("blocks")).unwrap();
    std::fs::write(src.join("blocks/mod.rs"), "use crate::hash::BlockHash;\n").unwrap();
    std::fs::write(
        src.join("blocks/cache.rs"),
        "use crate::hash::BlockHash;\nfn x() { crate::fs::thing(); }\n",
    )
    .unwrap();
    let bad = violations(src);
    assert!(
        bad.iter()
            .any(|b| b.starts_with("src/blocks/cache.rs:2: crate::fs")),
        "{bad:?}"
    );
    assert!(!bad.iter().any(|b| b.contains("blocks/mod.rs")), "{bad:?}");
}
