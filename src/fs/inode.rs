//! The inode table: kernel inode numbers to paths in the namespace and back.
//!
//! The filesystem is path-based: a path is what the store server knows. The kernel holds inode
//! numbers, counts its references (`lookup`/`forget`), and keeps them across renames, so a rename
//! moves the path of an inode and of everything below it.

use std::collections::HashMap;

pub const ROOT: u64 = 1;

pub struct Inodes {
    by_ino: HashMap<u64, (String, u64)>,
    by_path: HashMap<String, u64>,
    next: u64,
}

impl Default for Inodes {
    fn default() -> Self {
        let mut t = Inodes {
            by_ino: HashMap::new(),
            by_path: HashMap::new(),
            next: ROOT + 1,
        };
        t.by_ino.insert(ROOT, (String::new(), 1));
        t.by_path.insert(String::new(), ROOT);
        t
    }
}

impl Inodes {
    pub fn path(&self, ino: u64) -> Option<String> {
        self.by_ino.get(&ino).map(|(p, _)| p.clone())
    }

    /// The inode of `path`, allocated if new, without taking a kernel reference.
    pub fn ino(&mut self, path: &str) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            return ino;
        }
        let ino = self.next;
        self.next += 1;
        self.by_ino.insert(ino, (path.to_string(), 0));
        self.by_path.insert(path.to_string(), ino);
        ino
    }

    /// The inode of `path`, with one more kernel reference.
    pub fn lookup(&mut self, path: &str) -> u64 {
        let ino = self.ino(path);
        if let Some((_, n)) = self.by_ino.get_mut(&ino) {
            *n += 1;
        }
        ino
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
        }
    }

    /// Moves `from` and everything below it to `to`.
    pub fn rename(&mut self, from: &str, to: &str) {
        let pfx = format!("{from}/");
        let moved: Vec<(String, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| *p == from || p.starts_with(&pfx))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        // Whatever was at the destination loses its name.
        let to_pfx = format!("{to}/");
        self.by_path
            .retain(|p, _| p != to && !p.starts_with(&to_pfx));
        for (old, ino) in moved {
            self.by_path.remove(&old);
            let new = format!("{to}{}", &old[from.len()..]);
            if let Some((p, _)) = self.by_ino.get_mut(&ino) {
                *p = new.clone();
            }
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
}
