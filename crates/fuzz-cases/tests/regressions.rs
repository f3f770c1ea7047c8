//! Every input a fuzzer ever found to fail (`fuzz/regressions/<target>/`) and every seed
//! (`fuzz/seeds/<target>/`), run again through the very body the fuzzer ran: a bug it found
//! stays found. `bench/fuzz.sh` copies each new crash there.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use fuzz_cases::seeds::seeds;
use fuzz_cases::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files of `fuzz/<kind>/<target>/`, sorted (none where the folder is absent).
fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(fuzz_dir().join(kind).join(target)) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = dir
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.file_name().is_none_or(|n| n != ".gitkeep"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_kept_input_and_seed_passes_its_target() {
    let mut failed = Vec::new();
    let mut ran = 0;
    for (target, body) in TARGETS {
        let kept = inputs("regressions", target).into_iter();
        for path in kept.chain(inputs("seeds", target)) {
            let bytes = std::fs::read(&path).expect("a readable input");
            ran += 1;
            if catch_unwind(AssertUnwindSafe(|| body(&bytes))).is_err() {
                failed.push(path.display().to_string());
            }
        }
    }
    for (target, name, bytes) in seeds() {
        let (_, body) = TARGETS
            .iter()
            .find(|(t, _)| *t == target)
            .expect("a target");
        ran += 1;
        if catch_unwind(AssertUnwindSafe(|| body(&bytes))).is_err() {
            failed.push(format!("seed {target}/{name}"));
        }
    }
    fuzz_cases::remove_grpc_store();
    assert!(
        failed.is_empty(),
        "failed (see the panics above): {failed:?}"
    );
    assert!(ran > 0);
}

/// The seed files under fuzz/seeds are what `seeds()` makes; with `KT_WRITE_SEEDS=1` this
/// writes them instead, after a change to them.
#[test]
fn the_seed_files_are_the_seeds_made_here() {
    let write = std::env::var_os("KT_WRITE_SEEDS").is_some_and(|v| v == "1");
    for (target, name, bytes) in seeds() {
        let dir = fuzz_dir().join("seeds").join(target);
        let path = dir.join(name);
        if write {
            std::fs::create_dir_all(&dir).expect("the seeds folder");
            std::fs::write(&path, &bytes).expect("a seed file");
        }
        let on_disk = std::fs::read(&path).unwrap_or_default();
        assert!(
            on_disk == bytes,
            "{} differs from seeds(): run `KT_WRITE_SEEDS=1 cargo test -p fuzz-cases`",
            path.display()
        );
    }
}
