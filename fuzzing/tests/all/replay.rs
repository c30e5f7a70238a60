//! Replays `proto/fuzz/corpus/<target>/*` through `agentmesh_fuzzing::run`.

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use agentmesh_fuzzing::{TARGETS, run, seeds};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/fuzz")
}

/// The files of one target's corpus, sorted; panics if the directory is
/// missing.
fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join("corpus").join(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus directory {} is missing: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("read corpus directory").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_file_replays_through_its_target() {
    let mut failures = Vec::new();
    let mut counts = Vec::new();
    for target in TARGETS {
        let files = corpus(target);
        for path in &files {
            let data = std::fs::read(path).expect("read corpus file");
            let r = catch_unwind(AssertUnwindSafe(|| run(target, &data)));
            match r {
                Ok(Some(_)) => {}
                Ok(None) => panic!("{target} is not a target"),
                Err(_) => failures.push(path.display().to_string()),
            }
        }
        counts.push((*target, files.len()));
    }
    eprintln!("replayed per target: {counts:?}");
    for (target, n) in &counts {
        assert!(
            *n >= 1,
            "corpus of {target} is empty: the replay would pass without testing anything"
        );
    }
    assert!(
        failures.is_empty(),
        "inputs that fail their checks: {failures:#?}"
    );
}

#[test]
fn the_committed_corpus_holds_every_seed_as_generated() {
    for s in seeds::all() {
        let path = fuzz_dir().join("corpus").join(s.target).join(s.name);
        let committed = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; regenerate with `cargo run -p agentmesh-fuzzing --bin fuzz-seeds`",
                path.display()
            )
        });
        assert!(
            committed == s.data,
            "{} differs from its seed; regenerate with `cargo run -p agentmesh-fuzzing --bin fuzz-seeds`",
            path.display()
        );
    }
}

#[test]
fn seeds_reach_the_outcomes_they_are_for() {
    let all = seeds::all();
    for target in TARGETS {
        assert!(
            all.iter().filter(|s| s.target == *target).count() >= 3,
            "{target} has fewer than three seeds"
        );
    }
    for s in &all {
        let report = run(s.target, &s.data).expect("a target");
        for (step, outcome) in &s.expect {
            assert!(
                report.has(step, outcome),
                "{}/{}: expected {step} = {outcome}, got {:?}",
                s.target,
                s.name,
                report.steps
            );
        }
    }
}

#[test]
fn corpus_directories_and_fuzz_binaries_match_the_targets() {
    let wanted: BTreeSet<String> = TARGETS.iter().map(|t| t.to_string()).collect();
    let dirs: BTreeSet<String> = std::fs::read_dir(fuzz_dir().join("corpus"))
        .expect("corpus directory")
        .map(|e| e.expect("entry"))
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(dirs, wanted, "one corpus directory per target");
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz manifest");
    for t in TARGETS {
        assert!(
            manifest.contains(&format!("name = \"{t}\"\npath = \"fuzz_targets/{t}.rs\"")),
            "proto/fuzz/Cargo.toml has no [[bin]] {t}"
        );
        let src = std::fs::read_to_string(fuzz_dir().join(format!("fuzz_targets/{t}.rs")))
            .unwrap_or_else(|e| panic!("fuzz_targets/{t}.rs: {e}"));
        assert!(
            src.contains(&format!("agentmesh_fuzzing::targets::{t}::run(data)")),
            "fuzz_targets/{t}.rs does not run its target"
        );
    }
}
