//! Finding an NCCL library and making it loadable for a process about to start.
//!
//! `cudarc` opens NCCL under the names it knows (`libnccl.so`, `libnccl.so.12`, `.11`, ...),
//! never `libnccl.so.2`, the only name pip's `nvidia-nccl-cu12`/`-cu13` (torch's NCCL)
//! installs. The dynamic loader matches file names, not SONAMEs, and reads `LD_LIBRARY_PATH`
//! once, at process start, so preloading or changing the variable later does not help. What
//! does: a directory holding a `libnccl.so` link to the library, first on the
//! `LD_LIBRARY_PATH` of a process that has not started yet (the transfer worker, a re-executed
//! check). [`find_nccl_library`] looks where pip, conda, venvs and distributions put it,
//! [`nccl_library_dir`] makes the link, [`library_path_with`] the variable's new value.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};

/// Names the NCCL library to use, a file (pip's `.../nvidia/nccl/lib/libnccl.so.2`, say); when
/// set, nothing else is searched.
pub const NCCL_LIBRARY_ENV: &str = "KT_NCCL_LIBRARY";

/// The file pip's NCCL wheels install, below a `site-packages` directory.
const PIP_LIBRARY: &str = "nvidia/nccl/lib/libnccl.so.2";

/// Where a distribution's or NVIDIA's packages put `libnccl.so.2` (the runtime package,
/// without the `-dev` link).
const SYSTEM_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/local/lib",
    "/usr/local/cuda/lib64",
];

/// Python prefixes that hold `lib/python3.*/{site,dist}-packages`, after those the environment
/// names (`VIRTUAL_ENV`, `CONDA_PREFIX`, `~/.local`).
const PYTHON_PREFIXES: &[&str] = &["/usr/local", "/usr", "/opt/conda"];

/// The first NCCL library found, in this order: [`NCCL_LIBRARY_ENV`] (alone, when set); a
/// `libnccl.so.2` in a directory of `LD_LIBRARY_PATH`; pip's below each `PYTHONPATH` entry,
/// then below the `site-packages` (or Debian's `dist-packages`) of the active venv, conda
/// environment, `~/.local` and the system's Pythons (newest Python first); then the system's
/// library directories. `env` reads a variable; every path is taken below `root` (`/` but in
/// tests).
pub fn find_nccl_library(env: impl Fn(&str) -> Option<OsString>, root: &Path) -> Option<PathBuf> {
    let under = |p: &Path| root.join(p.strip_prefix("/").unwrap_or(p));
    if let Some(explicit) = env(NCCL_LIBRARY_ENV).filter(|v| !v.is_empty()) {
        let path = under(Path::new(&explicit));
        return path.is_file().then_some(path);
    }
    let dirs = |var: &str| -> Vec<PathBuf> {
        env(var)
            .map(|v| {
                std::env::split_paths(&v)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut candidates: Vec<PathBuf> = Vec::new();
    candidates.extend(
        dirs("LD_LIBRARY_PATH")
            .iter()
            .map(|d| under(&d.join("libnccl.so.2"))),
    );
    candidates.extend(
        dirs("PYTHONPATH")
            .iter()
            .map(|d| under(&d.join(PIP_LIBRARY))),
    );
    let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(|v| env(v).filter(|p| !p.is_empty()).map(PathBuf::from))
        .collect();
    if let Some(home) = env("HOME").filter(|h| !h.is_empty()) {
        prefixes.push(PathBuf::from(home).join(".local"));
    }
    prefixes.extend(PYTHON_PREFIXES.iter().map(PathBuf::from));
    for prefix in prefixes {
        for site in site_packages(&under(&prefix)) {
            candidates.push(site.join(PIP_LIBRARY));
        }
    }
    candidates.extend(
        SYSTEM_DIRS
            .iter()
            .map(|d| under(&Path::new(d).join("libnccl.so.2"))),
    );
    candidates.into_iter().find(|c| c.is_file())
}

/// `prefix/lib/python3*/{site,dist}-packages`, newest Python first.
fn site_packages(prefix: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
        return Vec::new();
    };
    let mut pythons: Vec<(Vec<u32>, PathBuf)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let version = name.strip_prefix("python3")?;
            // `python3` (Debian's shared dist-packages) sorts as the oldest.
            let key = version
                .split('.')
                .filter(|p| !p.is_empty())
                .map(|p| p.parse().ok())
                .collect::<Option<Vec<u32>>>()?;
            Some((key, e.path()))
        })
        .collect();
    pythons.sort_by(|a, b| b.0.cmp(&a.0));
    pythons
        .into_iter()
        .flat_map(|(_, dir)| [dir.join("site-packages"), dir.join("dist-packages")])
        .collect()
}

/// Makes `scratch/nccl/libnccl.so`, a link to `lib_path` (pip's `libnccl.so.2`, say), and
/// returns that directory, for the front of the worker's `LD_LIBRARY_PATH` at its start
/// ([`library_path_with`]). Calling it again with the same library changes nothing; with
/// another, it replaces the link atomically.
pub fn nccl_library_dir(lib_path: &Path, scratch: &Path) -> io::Result<PathBuf> {
    let target = lib_path.canonicalize()?;
    if !target.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a library file", target.display()),
        ));
    }
    let dir = scratch.join("nccl");
    std::fs::create_dir_all(&dir)?;
    let link = dir.join("libnccl.so");
    if std::fs::read_link(&link).is_ok_and(|t| t == target) {
        return Ok(dir);
    }
    let tmp = dir.join(format!(".libnccl.so.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&target, &tmp)?;
    std::fs::rename(&tmp, &link)?;
    Ok(dir)
}

/// `dir`, then the directories of `current` (an `LD_LIBRARY_PATH` value), as one value.
pub fn library_path_with(dir: &Path, current: Option<&OsStr>) -> OsString {
    let mut out = OsString::from(dir.as_os_str());
    if let Some(cur) = current.filter(|c| !c.is_empty()) {
        out.push(":");
        out.push(cur);
    }
    out
}

/// The NCCL a process has loaded, from the text of its `/proc/PID/maps`: the file of its first
/// mapping named `libnccl.so*` (torch maps its own with `import torch`).
pub fn loaded_nccl(maps: &str) -> Option<PathBuf> {
    maps.lines().find_map(|line| {
        // address perms offset dev inode, then the path (which may hold spaces).
        let mut rest = line;
        for _ in 0..5 {
            rest = rest.trim_start().split_once(char::is_whitespace)?.1;
        }
        let path = Path::new(rest.trim());
        let name = path.file_name()?.to_str()?;
        (path.is_absolute() && name.starts_with("libnccl.so")).then(|| path.to_path_buf())
    })
}

/// The library [`NCCL_LIBRARY_ENV`] names in `environ`, the text of a process's
/// `/proc/PID/environ` (NUL-separated `NAME=value` pairs).
pub fn nccl_named_in(environ: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let prefix = format!("{NCCL_LIBRARY_ENV}=");
    environ
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(prefix.as_bytes()))
        .filter(|v| v.first() == Some(&b'/'))
        .map(|v| PathBuf::from(OsStr::from_bytes(v)))
}

/// `LD_LIBRARY_PATH`'s new value for a process about to start to load `lib`, with a
/// `libnccl.so` link to it in `scratch`.
pub fn loader_path_for(lib: &Path, scratch: &Path) -> io::Result<OsString> {
    let dir = nccl_library_dir(lib, scratch)?;
    Ok(library_path_with(
        &dir,
        std::env::var_os("LD_LIBRARY_PATH").as_deref(),
    ))
}

/// What a process about to start needs in its environment to load the NCCL that
/// [`find_nccl_library`] finds: `LD_LIBRARY_PATH`'s new value, with a link in `scratch`; `None`
/// when no NCCL was found. Both the library and the value are returned, for a report.
pub fn loader_path_for_nccl(scratch: &Path) -> io::Result<Option<(PathBuf, OsString)>> {
    let Some(lib) = find_nccl_library(|v| std::env::var_os(v), Path::new("/")) else {
        return Ok(None);
    };
    let value = loader_path_for(&lib, scratch)?;
    Ok(Some((lib, value)))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"ELF").unwrap();
    }

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn a_callers_environment_names_its_nccl_by_an_absolute_path_only() {
        let env = b"HOME=/home/u\0KT_NCCL_LIBRARY=/opt/nccl/lib/libnccl.so.2\0PATH=/bin\0";
        assert_eq!(
            nccl_named_in(env),
            Some(PathBuf::from("/opt/nccl/lib/libnccl.so.2"))
        );
        assert_eq!(nccl_named_in(b"KT_NCCL_LIBRARY=libnccl.so.2\0"), None);
        assert_eq!(nccl_named_in(b"XKT_NCCL_LIBRARY=/x\0"), None);
        assert_eq!(nccl_named_in(b""), None);
    }

    #[test]
    fn nothing_there_finds_nothing() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(
            find_nccl_library(env_of(&[("HOME", "/root")]), root.path()),
            None
        );
    }

    #[test]
    fn pips_library_is_found_in_the_newest_system_python() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        touch(
            &r.join("usr/local/lib/python3.9/site-packages")
                .join(PIP_LIBRARY),
        );
        touch(
            &r.join("usr/local/lib/python3.12/dist-packages")
                .join(PIP_LIBRARY),
        );
        touch(
            &r.join("usr/local/lib/python3/dist-packages")
                .join(PIP_LIBRARY),
        );
        std::fs::create_dir_all(r.join("usr/local/lib/python3.x")).unwrap();
        let found = find_nccl_library(env_of(&[]), r).unwrap();
        assert_eq!(
            found,
            r.join("usr/local/lib/python3.12/dist-packages")
                .join(PIP_LIBRARY)
        );
    }

    #[test]
    fn the_environment_comes_before_the_system() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let system = r.join("usr/lib/x86_64-linux-gnu/libnccl.so.2");
        touch(&system);
        assert_eq!(find_nccl_library(env_of(&[]), r), Some(system.clone()));

        let user = r
            .join("home/u/.local/lib/python3.11/site-packages")
            .join(PIP_LIBRARY);
        touch(&user);
        let env = [("HOME", "/home/u")];
        assert_eq!(find_nccl_library(env_of(&env), r), Some(user.clone()));

        let venv = r
            .join("venv/lib/python3.10/site-packages")
            .join(PIP_LIBRARY);
        touch(&venv);
        let env = [("HOME", "/home/u"), ("VIRTUAL_ENV", "/venv")];
        assert_eq!(find_nccl_library(env_of(&env), r), Some(venv.clone()));

        let pythonpath = r.join("src/deps").join(PIP_LIBRARY);
        touch(&pythonpath);
        let env = [
            ("HOME", "/home/u"),
            ("VIRTUAL_ENV", "/venv"),
            ("PYTHONPATH", "/nowhere::/src/deps"),
        ];
        assert_eq!(find_nccl_library(env_of(&env), r), Some(pythonpath.clone()));

        let ld = r.join("opt/nccl/libnccl.so.2");
        touch(&ld);
        let env = [
            ("PYTHONPATH", "/src/deps"),
            ("LD_LIBRARY_PATH", "/opt/nccl"),
        ];
        assert_eq!(find_nccl_library(env_of(&env), r), Some(ld));
    }

    #[test]
    fn the_named_library_is_the_only_one_looked_at() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        touch(&r.join("usr/lib64/libnccl.so.2"));
        let mine = r.join("mine/libnccl.so.2.27.3");
        touch(&mine);
        let env = [(NCCL_LIBRARY_ENV, "/mine/libnccl.so.2.27.3")];
        assert_eq!(find_nccl_library(env_of(&env), r), Some(mine));
        // Named but missing: not found, rather than some other NCCL.
        let env = [(NCCL_LIBRARY_ENV, "/mine/gone.so")];
        assert_eq!(find_nccl_library(env_of(&env), r), None);
        // Empty: as if unset.
        let env = [(NCCL_LIBRARY_ENV, "")];
        assert_eq!(
            find_nccl_library(env_of(&env), r),
            Some(r.join("usr/lib64/libnccl.so.2"))
        );
    }

    #[test]
    fn the_library_dir_links_libnccl_so_to_the_named_library() {
        let tmp = tempfile::tempdir().unwrap();
        let lib = tmp
            .path()
            .join("site-packages/nvidia/nccl/lib/libnccl.so.2");
        std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
        std::fs::write(&lib, b"not really ELF").unwrap();
        let scratch = tmp.path().join("run");
        let dir = nccl_library_dir(&lib, &scratch).unwrap();
        assert_eq!(dir, scratch.join("nccl"));
        assert_eq!(
            std::fs::read(dir.join("libnccl.so")).unwrap(),
            b"not really ELF"
        );
        // Again: the same link; another library: the link follows it.
        assert_eq!(nccl_library_dir(&lib, &scratch).unwrap(), dir);
        let other = tmp.path().join("libnccl.so.2.27");
        std::fs::write(&other, b"another").unwrap();
        nccl_library_dir(&other, &scratch).unwrap();
        assert_eq!(std::fs::read(dir.join("libnccl.so")).unwrap(), b"another");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no stray links"
        );
        // What is not there, or not a file, is an error.
        assert!(nccl_library_dir(&tmp.path().join("missing.so.2"), &scratch).is_err());
        assert!(nccl_library_dir(tmp.path(), &scratch).is_err());

        assert_eq!(
            library_path_with(&dir, Some(OsStr::new("/usr/lib:/opt/lib"))),
            OsString::from(format!("{}:/usr/lib:/opt/lib", dir.display()))
        );
        assert_eq!(
            library_path_with(&dir, Some(OsStr::new(""))),
            dir.as_os_str()
        );
        assert_eq!(library_path_with(&dir, None), dir.as_os_str());
    }

    #[test]
    fn the_nccl_a_process_mapped_is_found_in_its_maps() {
        let maps = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 123 /usr/bin/python3.12
7f1c00000000-7f1c00200000 r--p 00000000 fd:01 456 /opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
7f1c00200000-7f1c00400000 r-xp 00200000 fd:01 456 /opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2
7f1d00000000-7f1d00021000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";
        assert_eq!(
            loaded_nccl(maps),
            Some(PathBuf::from(
                "/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"
            ))
        );
        let spaced = "7f1c00000000-7f1c00200000 r--p 00000000 fd:01 9 /my libs/libnccl.so.2.28.3\n";
        assert_eq!(
            loaded_nccl(spaced),
            Some(PathBuf::from("/my libs/libnccl.so.2.28.3"))
        );
        let none = "7f1c00000000-7f1c00200000 r--p 00000000 fd:01 9 /usr/lib/libc.so.6\n\
                    7f1c00000000-7f1c00200000 r--p 00000000 00:00 0 [vdso]\n";
        assert_eq!(loaded_nccl(none), None);
        assert_eq!(loaded_nccl(""), None);
        assert_eq!(loaded_nccl("garbage\n1 2\n"), None);
    }
}
