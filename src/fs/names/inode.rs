//! The inode table: kernel inode numbers to paths in the namespace and back.
//!
//! The filesystem is path-based: a path is what the store server knows. The kernel holds inode
//! numbers, counts its references (`lookup`/`forget`), and keeps them across renames, so a rename
//! moves the path of an inode and of everything below it.

use std::collections::HashMap;

use crate::db::Db;

pub const ROOT: u64 = 1;
/// The agent's column family of inode journals (`Journal`).
pub const CF_INODES: &str = "inodes";
/// The kernel reference count given to inodes restored from a journal: the real count died
/// with the agent that kept it, so they stay until the mount ends.
const HELD: u64 = u64::MAX / 2;
/// The journal's record of how far inode numbers were handed out, ahead by `RESERVE`, so that
/// a restarted agent never hands out a number the kernel may have seen.
const NEXT_KEY: u64 = u64::MAX;
const RESERVE: u64 = 4096;

/// The inodes the kernel holds, written through to the agent's database, so that an agent
/// restarted on a kept mount (`crate::keeper`) still knows what the kernel's inode numbers
/// name. Only inodes the kernel took a reference to are written: one write per first lookup,
/// rename or last forget, none on the read path.
pub struct Journal {
    db: Db,
    /// Key prefix of this mount: its mountpoint and a NUL.
    tag: Vec<u8>,
}

impl Journal {
    pub fn new(db: Db, mountpoint: &str) -> Self {
        let mut tag = mountpoint.as_bytes().to_vec();
        tag.push(0);
        Journal { db, tag }
    }

    fn key(&self, ino: u64) -> Vec<u8> {
        let mut k = self.tag.clone();
        k.extend_from_slice(&ino.to_be_bytes());
        k
    }

    fn put(&self, ino: u64, path: &str) {
        if let Err(e) = self.db.put(CF_INODES, &self.key(ino), path.as_bytes()) {
            tracing::warn!(error = %e, "could not record an inode");
        }
    }

    fn delete(&self, ino: u64) {
        if let Err(e) = self.db.delete(CF_INODES, &self.key(ino)) {
            tracing::warn!(error = %e, "could not forget an inode");
        }
    }

    fn reserve(&self, upto: u64) {
        if let Err(e) = self
            .db
            .put(CF_INODES, &self.key(NEXT_KEY), &upto.to_be_bytes())
        {
            tracing::warn!(error = %e, "could not record inode numbers");
        }
    }

    fn reserved(&self) -> u64 {
        self.db
            .get(CF_INODES, &self.key(NEXT_KEY))
            .ok()
            .flatten()
            .and_then(|v| v.try_into().ok().map(u64::from_be_bytes))
            .unwrap_or(ROOT + 1)
    }

    fn entries(&self) -> Vec<(u64, String)> {
        let rows = self
            .db
            .scan_prefix(CF_INODES, &self.tag)
            .unwrap_or_default();
        rows.into_iter()
            .filter_map(|(k, v)| {
                let ino = u64::from_be_bytes(k.get(self.tag.len()..)?.try_into().ok()?);
                (ino != NEXT_KEY).then_some(())?;
                Some((ino, String::from_utf8(v).ok()?))
            })
            .collect()
    }

    fn clear(&self) {
        for (ino, _) in self.entries() {
            self.delete(ino);
        }
        self.delete(NEXT_KEY);
    }
}

pub struct Inodes {
    by_ino: HashMap<u64, (String, u64)>,
    by_path: HashMap<String, u64>,
    next: u64,
    /// Numbers below this are recorded as handed out in the journal.
    reserved: u64,
    journal: Option<Journal>,
    /// The names of inodes known to have more than one (hard links made here): a name that
    /// goes passes the inode to another.
    names: HashMap<u64, Vec<String>>,
    /// The inode of each of the store's inode records (a file of several names) the kernel
    /// holds, and back: every name of one file shows one number, whichever node made its
    /// links, and after the kernel forgot some of its names.
    by_record: HashMap<u64, u64>,
    record_of: HashMap<u64, u64>,
}

impl Default for Inodes {
    fn default() -> Self {
        let mut t = Inodes {
            by_ino: HashMap::new(),
            by_path: HashMap::new(),
            next: ROOT + 1,
            reserved: 0,
            journal: None,
            names: HashMap::new(),
            by_record: HashMap::new(),
            record_of: HashMap::new(),
        };
        t.by_ino.insert(ROOT, (String::new(), 1));
        t.by_path.insert(String::new(), ROOT);
        t
    }
}

impl Inodes {
    /// A table written through to `journal`: empty for a new mount, or, when `restore`, what
    /// the journal holds (the kernel of a kept mount still uses those numbers).
    pub fn journaled(journal: Journal, restore: bool) -> Self {
        let mut t = Inodes::default();
        if restore {
            t.next = journal.reserved();
            for (ino, path) in journal.entries() {
                if ino == ROOT {
                    continue;
                }
                t.next = t.next.max(ino + 1);
                t.by_path.insert(path.clone(), ino);
                t.by_ino.insert(ino, (path, HELD));
            }
        } else {
            journal.clear();
        }
        t.journal = Some(journal);
        t
    }

    #[cfg(test)]
    fn ino_readonly(&self, path: &str) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    pub fn path(&self, ino: u64) -> Option<String> {
        self.path_ref(ino).map(str::to_string)
    }

    /// The path of `ino`, borrowed from the table.
    pub fn path_ref(&self, ino: u64) -> Option<&str> {
        self.by_ino.get(&ino).map(|(p, _)| p.as_str())
    }

    /// The inode of `path`, if it has one.
    pub fn known(&self, path: &str) -> Option<u64> {
        self.by_path.get(path).copied()
    }

    /// Every inode the table holds.
    pub fn known_inodes(&self) -> Vec<u64> {
        self.by_ino.keys().copied().collect()
    }

    /// Every path the table holds an inode of.
    pub fn known_paths(&self) -> Vec<String> {
        self.by_path.keys().cloned().collect()
    }

    /// The inode of `path`, allocated if new, without taking a kernel reference.
    pub fn ino(&mut self, path: &str) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        if let Some(j) = self.journal.as_ref().filter(|_| self.next > self.reserved) {
            self.reserved = self.next + RESERVE;
            j.reserve(self.reserved);
        }
        self.by_ino.insert(ino, (path.to_string(), 0));
        self.by_path.insert(path.to_string(), ino);
        ino
    }

    /// The inode of `path`, with one more kernel reference.
    pub fn lookup(&mut self, path: &str) -> u64 {
        let ino = self.ino(path);
        if let Some((_, n)) = self.by_ino.get_mut(&ino) {
            *n += 1;
            if *n == 1 {
                if let Some(j) = &self.journal {
                    j.put(ino, path);
                }
            }
        }
        ino
    }

    /// [`Inodes::lookup`] of a name of the store's inode record `record` (0: a file of one
    /// name): the inode the record's other names have, while the kernel holds one.
    pub fn lookup_record(&mut self, path: &str, record: u64) -> u64 {
        if record == 0 {
            return self.lookup(path);
        }
        match self.by_record.get(&record).copied() {
            Some(ino) if self.by_ino.contains_key(&ino) => {
                if self.by_path.get(path) == Some(&ino) {
                    self.lookup(path)
                } else {
                    self.link(ino, path);
                    ino
                }
            }
            _ => {
                let ino = self.lookup(path);
                self.by_record.insert(record, ino);
                self.record_of.insert(ino, record);
                ino
            }
        }
    }

    /// Makes `path` a second name of `ino` (a hard link), with one more kernel reference.
    pub fn link(&mut self, ino: u64, path: &str) {
        let Some((first, refs)) = self.by_ino.get_mut(&ino) else {
            return;
        };
        *refs += 1;
        let first = first.clone();
        let names = self.names.entry(ino).or_insert_with(|| vec![first]);
        if !names.iter().any(|n| n == path) {
            names.push(path.to_string());
        }
        self.by_path.insert(path.to_string(), ino);
    }

    /// The names of `ino`, where it is known to have several.
    pub fn names(&self, ino: u64) -> Option<Vec<String>> {
        self.names.get(&ino).cloned()
    }

    /// `ino`'s name `gone` went away elsewhere: it goes on under its name `to`.
    pub fn pass_on(&mut self, ino: u64, gone: &str, to: &str) {
        if let Some(names) = self.names.get_mut(&ino) {
            names.retain(|n| n != gone);
            if names.len() < 2 {
                self.names.remove(&ino);
            }
        }
        if self.by_path.get(gone) == Some(&ino) {
            self.by_path.remove(gone);
        }
        if let Some((p, refs)) = self.by_ino.get_mut(&ino) {
            *p = to.to_string();
            if *refs > 0 {
                if let Some(j) = &self.journal {
                    j.put(ino, to);
                }
            }
        }
    }

    /// The other names of the inode at `path`, where it has several.
    pub fn other_names(&self, path: &str) -> Vec<String> {
        let Some(ino) = self.by_path.get(path) else {
            return Vec::new();
        };
        self.names
            .get(ino)
            .map(|n| n.iter().filter(|n| *n != path).cloned().collect())
            .unwrap_or_default()
    }

    /// `path` was unlinked: its inode, if it has another name, goes on under that one.
    pub fn unlinked(&mut self, path: &str) {
        let Some(&ino) = self.by_path.get(path) else {
            return;
        };
        let Some(names) = self.names.get_mut(&ino) else {
            return;
        };
        names.retain(|n| n != path);
        let Some(other) = names.first().cloned() else {
            self.names.remove(&ino);
            return;
        };
        if names.len() == 1 {
            self.names.remove(&ino);
        }
        self.by_path.remove(path);
        if let Some((p, refs)) = self.by_ino.get_mut(&ino) {
            *p = other.clone();
            if *refs > 0 {
                if let Some(j) = &self.journal {
                    j.put(ino, &other);
                }
            }
        }
    }

    pub fn forget(&mut self, ino: u64, n: u64) {
        if ino == ROOT {
            return;
        }
        let gone = match self.by_ino.get_mut(&ino) {
            Some((_, refs)) => {
                *refs = refs.saturating_sub(n);
                *refs == 0
            }
            None => false,
        };
        if gone {
            if let Some((path, _)) = self.by_ino.remove(&ino) {
                if self.by_path.get(&path) == Some(&ino) {
                    self.by_path.remove(&path);
                }
            }
            for name in self.names.remove(&ino).unwrap_or_default() {
                if self.by_path.get(&name) == Some(&ino) {
                    self.by_path.remove(&name);
                }
            }
            if let Some(r) = self.record_of.remove(&ino) {
                if self.by_record.get(&r) == Some(&ino) {
                    self.by_record.remove(&r);
                }
            }
            if let Some(j) = &self.journal {
                j.delete(ino);
            }
        }
    }

    /// Moves `from` and everything below it to `to`.
    pub fn rename(&mut self, from: &str, to: &str) {
        let moved = self.take(from);
        // Whatever was at the destination loses its name.
        self.unlinked(to);
        let to_pfx = format!("{to}/");
        self.by_path
            .retain(|p, _| p != to && !p.starts_with(&to_pfx));
        self.place(Self::renamed(moved, from, to));
    }

    /// Swaps `a` and `b`, each with everything below it (`RENAME_EXCHANGE`): every inode keeps
    /// its number under its new path.
    pub fn exchange(&mut self, a: &str, b: &str) {
        let (at_a, at_b) = (self.take(a), self.take(b));
        let mut moves = Self::renamed(at_a, a, b);
        moves.extend(Self::renamed(at_b, b, a));
        self.place(moves);
    }

    /// The inodes at `from` and below it, taken out of the path index.
    fn take(&mut self, from: &str) -> Vec<(String, u64)> {
        let pfx = format!("{from}/");
        let moved: Vec<(String, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| *p == from || p.starts_with(&pfx))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        for (p, _) in &moved {
            self.by_path.remove(p);
        }
        moved
    }

    fn renamed(taken: Vec<(String, u64)>, from: &str, to: &str) -> Vec<(String, String, u64)> {
        taken
            .into_iter()
            .map(|(old, ino)| {
                let new = format!("{to}{}", &old[from.len()..]);
                (old, new, ino)
            })
            .collect()
    }

    /// Puts taken inodes back under their new paths, all moves at once (so that in an
    /// exchange a name moved from `a` to `b` is not moved on by the move from `b` to `a`).
    fn place(&mut self, moves: Vec<(String, String, u64)>) {
        let new_of: HashMap<&str, &str> = moves
            .iter()
            .map(|(old, new, _)| (old.as_str(), new.as_str()))
            .collect();
        for names in self.names.values_mut() {
            for n in names.iter_mut() {
                if let Some(new) = new_of.get(n.as_str()) {
                    *n = new.to_string();
                }
            }
        }
        for (old, new, ino) in &moves {
            if let Some((p, refs)) = self.by_ino.get_mut(ino) {
                if p == old {
                    p.clone_from(new);
                    if *refs > 0 {
                        if let Some(j) = &self.journal {
                            j.put(*ino, new);
                        }
                    }
                }
            }
        }
        for (_, new, ino) in moves {
            self.by_path.insert(new, ino);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_move_subtrees_and_forget_frees() {
        let mut t = Inodes::default();
        let a = t.lookup("a");
        let ab = t.lookup("a/b");
        let x = t.lookup("x");
        t.rename("a", "x");
        assert_eq!(t.path(a).unwrap(), "x");
        assert_eq!(t.path(ab).unwrap(), "x/b");
        assert_eq!(t.ino("x"), a);
        assert_eq!(
            t.path(x).unwrap(),
            "x",
            "the replaced inode keeps its last name"
        );
        t.forget(ab, 1);
        assert!(t.path(ab).is_none());
        assert_ne!(t.ino("x/b"), ab);
        assert_eq!(t.path(ROOT).unwrap(), "");
    }

    #[test]
    fn names_of_one_store_record_share_an_inode_until_the_kernel_forgets_them_all() {
        let mut t = Inodes::default();
        // Looked up on its own first (before anyone linked it), then as a name of record 9.
        let before = t.lookup("f");
        let f = t.lookup_record("f", 9);
        assert_eq!(f, before);
        let g = t.lookup_record("d/g", 9);
        assert_eq!(g, f, "two names of one file, two numbers");
        assert_eq!(t.lookup_record("other", 10), t.ino("other"));
        assert_ne!(t.ino("other"), f);
        // The kernel forgets one name's reference: the other still holds the number.
        t.forget(f, 1);
        assert_eq!(t.lookup_record("f", 9), f);
        // Forgotten whole (2 references of f, 1 of d/g): the record's next name gets a new one.
        t.forget(f, 3);
        assert!(t.path(f).is_none());
        let again = t.lookup_record("d/g", 9);
        assert_ne!(again, f);
        assert_eq!(t.lookup_record("f", 9), again);
    }

    #[test]
    fn an_exchange_swaps_subtrees_and_the_names_of_links_once() {
        let mut t = Inodes::default();
        let a = t.lookup("a");
        let ab = t.lookup("a/b");
        let f = t.lookup("f");
        // `f` is also named `c` (a hard link): its name list must follow the swap once.
        t.link(f, "c");
        t.exchange("a", "f");
        assert_eq!(t.path(a).as_deref(), Some("f"));
        assert_eq!(t.path(ab).as_deref(), Some("f/b"));
        assert_eq!(t.path(f).as_deref(), Some("a"));
        assert_eq!((t.ino("f"), t.ino("f/b"), t.ino("a")), (a, ab, f));
        let mut names = t.other_names("a");
        names.sort();
        assert_eq!(names, ["c"]);
        assert_eq!(t.other_names("c"), ["a"]);
    }

    #[test]
    fn a_journaled_table_comes_back_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path(), &[CF_INODES], &[]).unwrap();
        let mut t = Inodes::journaled(Journal::new(db.clone(), "/mnt/a"), false);
        let a = t.lookup("a");
        let ab = t.lookup("a/b");
        let gone = t.lookup("gone");
        let listed = t.ino("only-listed");
        t.forget(gone, 1);
        t.rename("a", "z");
        // Another mount's journal is separate.
        let mut other = Inodes::journaled(Journal::new(db.clone(), "/mnt/b"), false);
        other.lookup("elsewhere");
        drop(t);

        let mut t = Inodes::journaled(Journal::new(db.clone(), "/mnt/a"), true);
        assert_eq!(t.path(a).as_deref(), Some("z"));
        assert_eq!(t.path(ab).as_deref(), Some("z/b"));
        assert_eq!(t.ino("z/b"), ab);
        assert!(t.path(gone).is_none(), "forgotten inodes are not restored");
        assert!(
            t.path(listed).is_none(),
            "only what the kernel holds is journaled"
        );
        let new = t.lookup("new");
        assert!(new > ab && new > listed, "new numbers never reuse old ones");
        // The kernel's count is unknown after a restart: a forget does not drop the inode.
        t.forget(a, 1);
        assert_eq!(t.path(a).as_deref(), Some("z"));

        // A fresh mount at the same place starts clean.
        let t = Inodes::journaled(Journal::new(db.clone(), "/mnt/a"), false);
        assert!(t.path(a).is_none());
        let other = Inodes::journaled(Journal::new(db, "/mnt/b"), true);
        assert_eq!(other.ino_readonly("elsewhere"), Some(ROOT + 1));
    }
}
