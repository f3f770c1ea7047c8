//! Reading a Rust file's paths as text, for `tests/layering.rs`: its code without comments,
//! strings and test items, the `crate::` paths it names, and every path it names resolved to a
//! module of the crate.

use std::path::{Path, PathBuf};

/// One file of `src/`, read.
pub struct Source {
    /// Its path below `src/`.
    pub rel: PathBuf,
    /// Its module's path from its crate's root (`[]` for `lib.rs` and `main.rs`).
    pub module: Vec<String>,
    /// Whether it belongs to the binary (`main.rs`, `cli/`) rather than the library.
    pub binary: bool,
    /// The code with comments, strings and `#[cfg(test)]` items blanked out (lines kept).
    pub code: String,
    pub lines: usize,
    /// Child modules it declares in files of their own, for tests only.
    pub test_children: Vec<String>,
    /// Child modules it declares otherwise.
    pub children: Vec<String>,
}

impl Source {
    pub fn parse(rel: PathBuf, text: &str) -> Source {
        let mut module: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        let binary = module[0] == "main" || module[0] == "cli";
        if module.last().is_some_and(|p| p == "mod")
            || matches!(rel.to_str(), Some("lib.rs" | "main.rs"))
        {
            module.pop();
        }
        let bare = code_only(text);
        let test_children = test_mods(&bare);
        let code = blank_test_items(&bare);
        let children = mods(&code);
        Source {
            rel,
            module,
            binary,
            code,
            lines: text.lines().count(),
            test_children,
            children,
        }
    }

    /// The top-level module it belongs to (`lib` for the library's root).
    pub fn top(&self) -> &str {
        match self.module.first() {
            Some(m) => m,
            None if self.binary => "main",
            None => "lib",
        }
    }

    /// How deep below the crate root its code stands (what a `super::` climbs from).
    pub fn depth(&self) -> usize {
        self.module.len()
    }

    pub fn child_path(&self, child: &str) -> Vec<String> {
        let mut p = self.module.clone();
        p.push(child.to_string());
        p
    }

    /// Every path its code names that resolves into its own crate (or, from the binary, into
    /// the library as `ktfs::`), with its line: `(line, into the binary, absolute path)`.
    pub fn resolved_paths(&self) -> Vec<(usize, bool, Vec<String>)> {
        let mut out = Vec::new();
        for (line, path) in use_paths(&self.code)
            .into_iter()
            .chain(inline_paths(&self.code))
        {
            if let Some(r) = self.resolve(&path) {
                out.push((line, r.0, r.1));
            }
        }
        out
    }

    fn resolve(&self, path: &[String]) -> Option<(bool, Vec<String>)> {
        let first = path.first()?.as_str();
        let (binary, base, rest) = match first {
            "crate" => (self.binary, Vec::new(), &path[1..]),
            "ktfs" => (false, Vec::new(), &path[1..]),
            "self" => (self.binary, self.module.clone(), &path[1..]),
            "super" => {
                let up = path.iter().take_while(|s| *s == "super").count();
                let keep = self.module.len().checked_sub(up)?;
                (self.binary, self.module[..keep].to_vec(), &path[up..])
            }
            c if self.children.iter().any(|m| m == c) => (self.binary, self.module.clone(), path),
            _ => return None,
        };
        let mut abs = base;
        abs.extend(rest.iter().cloned());
        Some((binary, abs))
    }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn ident_before(b: &[char], i: usize) -> bool {
    i > 0 && is_ident(b[i - 1])
}

fn ident_at(s: &str) -> String {
    s.trim_start()
        .chars()
        .take_while(|c| is_ident(*c))
        .collect()
}

fn line_at(code: &str, at: usize) -> usize {
    code[..at].matches('\n').count() + 1
}

/// The source with comments, string and char literals blanked out (lines kept).
pub fn code_only(src: &str) -> String {
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

/// Where each `#[cfg(test)]` item of `code` starts (its attribute) and ends (after its `;` or
/// its closing brace).
fn test_items(code: &str) -> Vec<(usize, usize)> {
    const ATTR: &str = "#[cfg(test)]";
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(pos) = code[from..].find(ATTR) {
        let start = from + pos;
        let mut i = start + ATTR.len();
        // Brackets of every kind, so that `[u8; 4]` in a signature does not end the item.
        let mut depth = 0usize;
        while i < b.len() {
            match b[i] {
                b'{' | b'(' | b'[' => depth += 1,
                b'}' if depth == 1 => {
                    i += 1;
                    break;
                }
                b'}' | b')' | b']' => depth = depth.saturating_sub(1),
                b';' if depth == 0 => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        out.push((start, i.min(b.len())));
        from = i.min(b.len());
    }
    out
}

fn blank_test_items(code: &str) -> String {
    let mut out = code.to_string();
    for (a, b) in test_items(code) {
        let blank: String = code[a..b]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(a..b, &blank);
    }
    out
}

/// The names of `mod NAME;` declarations in `code`.
fn mods(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(pos) = code[from..].find("mod ") {
        let at = from + pos;
        from = at + 4;
        if at > 0 && is_ident(code[..at].chars().next_back().unwrap_or(' ')) {
            continue;
        }
        let name = ident_at(&code[at + 4..]);
        let after = code[at + 4..].trim_start()[name.len()..].trim_start();
        if !name.is_empty() && after.starts_with(';') {
            out.push(name);
        }
    }
    out
}

/// The child modules declared under `#[cfg(test)]`.
fn test_mods(code: &str) -> Vec<String> {
    test_items(code)
        .into_iter()
        .flat_map(|(a, b)| mods(&code[a..b]))
        .collect()
}

/// Every top-level module named by a `crate::` path in `code`, with its line.
pub fn crate_paths(code: &str) -> Vec<(usize, String)> {
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
        let line = line_at(code, at);
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
pub fn escaping_supers(code: &str, depth: usize) -> Vec<usize> {
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
                out.push(line_at(code, i));
            }
        }
        i += 1;
    }
    out
}

/// The tokens of a `use` tree: names, `::`, braces, commas, `*` and `as`.
fn use_tokens(tree: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = tree.chars().peekable();
    while let Some(c) = chars.next() {
        if is_ident(c) {
            let mut word = c.to_string();
            while let Some(&n) = chars.peek().filter(|n| is_ident(**n)) {
                word.push(n);
                chars.next();
            }
            out.push(word);
        } else if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            out.push("::".into());
        } else if "{},*".contains(c) {
            out.push(c.to_string());
        }
    }
    out
}

/// The full paths of a `use` tree's leaves (`a::{b, c::d as e, self}`: `a::b`, `a::c::d`, `a`).
fn expand(tokens: &[String], i: &mut usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    while let Some(t) = tokens.get(*i) {
        match t.as_str() {
            "{" => {
                *i += 1;
                while *i < tokens.len() && tokens[*i] != "}" {
                    expand(tokens, i, &path, out);
                    if tokens.get(*i).is_some_and(|t| t == ",") {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            "," | "}" => break,
            "::" | "*" => *i += 1,
            "as" => *i += 2,
            // `a::{self}` names `a`; a leading `self::` is the module's own.
            "self" if !path.is_empty() => *i += 1,
            name => {
                path.push(name.to_string());
                *i += 1;
            }
        }
    }
    if !path.is_empty() {
        out.push(path);
    }
}

/// The paths of the `use` declarations in `code`, with their lines.
fn use_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(pos) = code[from..].find("use ") {
        let at = from + pos;
        from = at + 4;
        if at > 0 && is_ident(code[..at].chars().next_back().unwrap_or(' ')) {
            continue;
        }
        let Some(end) = code[at..].find(';') else {
            break;
        };
        let tokens = use_tokens(&code[at + 4..at + end]);
        let mut paths = Vec::new();
        expand(&tokens, &mut 0, &[], &mut paths);
        let line = line_at(code, at);
        out.extend(paths.into_iter().map(|p| (line, p)));
    }
    out
}

/// Paths in code outside `use` declarations: `a::b::c` where `a` is a name (the caller keeps
/// those that resolve).
fn inline_paths(code: &str) -> Vec<(usize, Vec<String>)> {
    let b: Vec<char> = code.chars().collect();
    let mut offsets = Vec::with_capacity(b.len());
    let mut off = 0;
    for c in &b {
        offsets.push(off);
        off += c.len_utf8();
    }
    let mut out = Vec::new();
    let mut i = 0;
    let mut in_use = false;
    while i < b.len() {
        if b[i] == ';' {
            in_use = false;
        }
        if !is_ident(b[i]) || ident_before(&b, i) {
            i += 1;
            continue;
        }
        let start = i;
        let mut path = Vec::new();
        loop {
            let s = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            path.push(b[s..i].iter().collect::<String>());
            if b.get(i) == Some(&':')
                && b.get(i + 1) == Some(&':')
                && b.get(i + 2).is_some_and(|c| is_ident(*c))
            {
                i += 2;
            } else {
                break;
            }
        }
        if path.len() == 1 && path[0] == "use" {
            in_use = true;
        } else if !in_use && path.len() > 1 {
            out.push((line_at(code, offsets[start]), path));
        }
    }
    out
}

/// The path of a file below `src/`, shown as the checker names it.
pub fn shown(rel: &Path) -> String {
    Path::new("src").join(rel).display().to_string()
}
