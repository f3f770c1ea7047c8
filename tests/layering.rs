//! The shape of `src/`, checked from the code's own paths:
//!
//! - **layers**: every path from a top-level module into another must point down the order
//!
//!   ```text
//!   cli (the binary) -> agent | server -> fs -> transfer -> broadcast -> dataplane -> rpc
//!                                                                       -> auth -> blocks -> data model
//!                       server -> meta
//!   ```
//!
//!   with `gpu` (the GPU control tree and workers) below `fs`, `keeper` below `fs` and `agent`,
//!   and `k8s` beside `auth`; a new module, or a new kind of edge, is added to [`LAYERS`] on
//!   purpose, never by accident;
//! - **no circles**: among the files of `src/`, no file reaches itself through the paths its
//!   non-test items name (`use`, `pub use`, inline `crate::`/`super::`/`self::` paths, and
//!   paths through a child module; `mod` declarations do not count), at any length;
//! - **small files**: no non-test file over [`MAX_LINES`] lines.
//!
//! Paths are read as text (comments, strings and `#[cfg(test)]` items blanked out) and resolved
//! to the file that defines the module they name.

mod paths;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use paths::{code_only, crate_paths, escaping_supers, shown, Source};

/// Longest non-test file of `src/`.
const MAX_LINES: usize = 800;

/// The data model and the primitives everything may use.
const DATA_MODEL: &[&str] = &[
    "proto", "hash", "key", "manifest", "clock", "locks", "metrics", "db", "bridge", "objects",
];

/// Within the data model.
const DATA_MODEL_EDGES: &[(&str, &[&str])] = &[
    ("proto", &[]),
    ("hash", &[]),
    ("key", &[]),
    ("locks", &[]),
    ("metrics", &["locks"]),
    ("db", &["locks"]),
    ("bridge", &[]),
    ("objects", &["bridge"]),
    ("clock", &["locks"]),
    ("manifest", &["hash", "key", "proto"]),
];

/// The layers from the top down: a module may import the data model and any module of a layer
/// below its own, never one of its own layer or above.
const LAYERS: &[&[&str]] = &[
    &["agent", "server"],
    &["meta", "fs"],
    &["gpu", "transfer"],
    &["broadcast", "keeper"],
    &["dataplane"],
    &["rpc"],
    &["auth", "k8s"],
    &["blocks"],
];

/// Modules only some layers above may import, whatever the order allows: what the store
/// server keeps is the server's alone.
const PRIVATE_TO: &[(&str, &[&str])] = &[("meta", &["server"])];

/// The binary's own modules (`src/main.rs`, `src/cli/`): they use the library as `ktfs::…`,
/// and `crate::…` there names only themselves.
const BINARY: &[&str] = &["main", "cli"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Whether top-level module `from` may name `to`.
fn may_import(from: &str, to: &str) -> Result<(), String> {
    if from == to {
        return Ok(());
    }
    if let Some((_, edges)) = DATA_MODEL_EDGES.iter().find(|(m, _)| *m == from) {
        return if edges.contains(&to) {
            Ok(())
        } else {
            Err(format!(
                "the data model's `{from}` may import only {edges:?}"
            ))
        };
    }
    if DATA_MODEL.contains(&to) {
        return Ok(());
    }
    let Some(own) = layer_of(from) else {
        return Err(format!(
            "module `{from}` has no place in the layers (tests/layering.rs)"
        ));
    };
    if let Some((_, who)) = PRIVATE_TO.iter().find(|(m, _)| *m == to) {
        if !who.contains(&from) {
            return Err(format!("`{to}` is private to {who:?}"));
        }
    }
    match layer_of(to) {
        Some(l) if l > own => Ok(()),
        Some(_) => Err(format!("`{to}` is not below `{from}` in the layers")),
        None => Err(format!("module `{to}` has no place in the layers")),
    }
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

/// Every file of `src_dir`, read and parsed, test-only files left out.
fn sources(src_dir: &Path) -> Vec<Source> {
    let mut files = Vec::new();
    rust_files(src_dir, &mut files);
    files.sort();
    let all: Vec<Source> = files
        .iter()
        .map(|f| {
            let rel = f.strip_prefix(src_dir).expect("under src").to_path_buf();
            Source::parse(rel, &std::fs::read_to_string(f).expect("read"))
        })
        .collect();
    // A file is test-only when its parent declares it under `#[cfg(test)]`, or it lies below
    // such a file.
    let test_modules: BTreeSet<Vec<String>> = all
        .iter()
        .flat_map(|s| {
            s.test_children
                .iter()
                .map(|c| s.child_path(c))
                .collect::<Vec<_>>()
        })
        .collect();
    all.into_iter()
        .filter(|s| !test_modules.iter().any(|t| s.module.starts_with(t)))
        .collect()
}

/// Import edges between files (indices into `files`), each with a line that makes it.
fn file_edges(files: &[Source]) -> BTreeMap<(usize, usize), usize> {
    let by_module: BTreeMap<(bool, &[String]), usize> = files
        .iter()
        .enumerate()
        .map(|(i, s)| ((s.binary, s.module.as_slice()), i))
        .collect();
    let mut edges = BTreeMap::new();
    for (i, s) in files.iter().enumerate() {
        for (line, binary, path) in s.resolved_paths() {
            // The longest prefix of the path that is a file's module is where it points.
            let target = (0..=path.len())
                .rev()
                .find_map(|n| by_module.get(&(binary, &path[..n])).copied());
            if let Some(t) = target.filter(|t| *t != i) {
                edges.entry((i, t)).or_insert(line);
            }
        }
    }
    edges
}

/// The circles of the graph: its strongly connected components of more than one file
/// (Tarjan's algorithm, iterative).
fn circles(n: usize, edges: &BTreeMap<(usize, usize), usize>) -> Vec<Vec<usize>> {
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); n];
    for &(a, b) in edges.keys() {
        next[a].push(b);
    }
    let (mut index, mut low) = (vec![usize::MAX; n], vec![0; n]);
    let (mut on_stack, mut stack, mut out) = (vec![false; n], Vec::new(), Vec::new());
    let mut counter = 0;
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some(&mut (v, ref mut k)) = work.last_mut() {
            if *k == 0 {
                index[v] = counter;
                low[v] = counter;
                counter += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = next[v].get(*k) {
                *k += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    out.push(comp);
                }
            }
        }
    }
    out
}

/// What breaks the layers, the files' circles and the size of files, one line each.
fn violations(src_dir: &Path) -> Vec<String> {
    let files = sources(src_dir);
    let mut bad = Vec::new();
    let mut seen = BTreeSet::new();
    for s in &files {
        let (module, at) = (s.top(), shown(&s.rel));
        seen.insert(module.to_string());
        if s.lines > MAX_LINES {
            bad.push(format!("{at}: {} lines (at most {MAX_LINES})", s.lines));
        }
        for (line, to) in crate_paths(&s.code) {
            if s.binary {
                if !BINARY.contains(&to.as_str()) {
                    bad.push(format!(
                        "{at}:{line}: crate::{to} (the binary uses the library as ktfs::{to})"
                    ));
                }
            } else if let Err(why) = may_import(module, &to) {
                bad.push(format!("{at}:{line}: crate::{to} ({why})"));
            }
        }
        if !s.binary && module != "lib" {
            for line in escaping_supers(&s.code, s.depth()) {
                bad.push(format!(
                    "{at}:{line}: a super:: path that leaves `{module}` (write crate::… instead)"
                ));
            }
        }
    }
    let edges = file_edges(&files);
    for circle in circles(files.len(), &edges) {
        let ties: Vec<String> = circle
            .iter()
            .flat_map(|&a| circle.iter().map(move |&b| (a, b)))
            .filter_map(|(a, b)| {
                let line = edges.get(&(a, b))?;
                Some(format!(
                    "{}:{line} -> {}",
                    shown(&files[a].rel),
                    shown(&files[b].rel)
                ))
            })
            .collect();
        bad.push(format!("a circle: {}", ties.join(", ")));
    }
    // The table names only modules that exist, so it cannot drift from the tree unnoticed.
    for m in LAYERS.iter().flat_map(|l| l.iter()).chain(DATA_MODEL) {
        if *m != "proto" && !seen.contains(*m) {
            bad.push(format!(
                "the layering table names `{m}`, which src/ does not have"
            ));
        }
    }
    bad
}

#[test]
fn dependencies_point_one_way_without_circles_in_small_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let bad = violations(&src);
    assert!(bad.is_empty(), "the shape of src/:\n  {}", bad.join("\n  "));
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

/// A tree of files for the checker's own tests.
fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

#[test]
fn a_forbidden_edge_is_named_with_its_file_and_path() {
    let dir = tree(&[
        ("lib.rs", "pub mod blocks;\npub mod fs;\npub mod hash;\n"),
        ("hash.rs", "pub struct BlockHash;\n"),
        (
            "blocks/mod.rs",
            "pub mod cache;\nuse crate::hash::BlockHash;\n",
        ),
        (
            "blocks/cache.rs",
            "use crate::hash::BlockHash;\nfn x() { crate::fs::thing(); }\n",
        ),
        ("fs/mod.rs", "pub fn thing() {}\n"),
    ]);
    let bad = violations(dir.path());
    assert!(
        bad.iter()
            .any(|b| b.starts_with("src/blocks/cache.rs:2: crate::fs (")),
        "{bad:?}"
    );
    assert!(!bad.iter().any(|b| b.contains("blocks/mod.rs")), "{bad:?}");
}

#[test]
fn circles_are_found_through_super_self_children_and_reexports_but_not_in_tests() {
    let dir = tree(&[
        ("lib.rs", "pub mod blocks;\n"),
        // mod.rs re-exports a child that names mod.rs back: a circle of two.
        (
            "blocks/mod.rs",
            "pub mod a;\nmod b;\nmod c;\n#[cfg(test)]\nmod tests;\npub use a::A;\npub struct Shared;\n",
        ),
        ("blocks/a.rs", "pub struct A;\nfn f() -> super::Shared { todo!() }\n"),
        // b -> c -> b through a child path and a use of self's sibling; a test module's
        // paths do not count.
        (
            "blocks/b.rs",
            "use super::c::C;\npub struct B;\n#[cfg(test)]\nmod tests {\n use crate::blocks::a::A;\n}\n",
        ),
        ("blocks/c.rs", "pub struct C;\nfn g() { let _ = crate::blocks::b::B; }\n"),
        ("blocks/tests.rs", "use super::a::A;\nuse super::Shared;\n"),
    ]);
    let bad = violations(dir.path());
    let circles: Vec<&String> = bad.iter().filter(|b| b.starts_with("a circle")).collect();
    assert_eq!(circles.len(), 2, "{bad:?}");
    assert!(circles
        .iter()
        .any(|c| c.contains("src/blocks/a.rs:2 -> src/blocks/mod.rs")
            && c.contains("src/blocks/mod.rs:6 -> src/blocks/a.rs")));
    assert!(circles
        .iter()
        .any(|c| c.contains("src/blocks/b.rs:1 -> src/blocks/c.rs")
            && c.contains("src/blocks/c.rs:2 -> src/blocks/b.rs")));
}

#[test]
fn a_long_file_is_named() {
    let dir = tree(&[
        ("lib.rs", "pub mod blocks;\n"),
        ("blocks/mod.rs", &"// a line\n".repeat(MAX_LINES + 1)),
    ]);
    let bad = violations(dir.path());
    assert!(
        bad.iter()
            .any(|b| b.starts_with("src/blocks/mod.rs: 801 lines")),
        "{bad:?}"
    );
}
