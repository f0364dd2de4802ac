//! The fuzz targets' saved reproducers (`fuzz/regressions/<target>/`) and seeds
//! (`fuzz/corpus/<target>/`), replayed through the targets' own bodies on stable Rust:
//! every input a fuzzer ever crashed on stays fixed, run by the README's test command.
//!
//! Each target's body lives in `fuzz/checks/<target>.rs`, included both here and by its
//! libFuzzer target (`fuzz/fuzz_targets/<target>.rs`), so the invariants checked here are
//! the fuzzer's own.
#![allow(missing_docs, dead_code)]

use std::path::{Path, PathBuf};

macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        $(mod $name {
            include!(concat!("../../../../fuzz/checks/", stringify!($name), ".rs"));
        })*

        /// Every target, by name, with its check.
        const TARGETS: &[(&str, fn(&[u8]))] = &[$((stringify!($name), $name::check)),*];
    };
}

targets!(
    amount,
    controller_config,
    controller_discovery,
    health_json,
    http1_framing,
    http1_request,
    http1_response,
    lb_config,
    sim_scenario,
    vigil_options,
);

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The inputs saved under `fuzz/<kind>/<target>/` (notes are not inputs).
fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join(kind).join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.is_file() && !matches!(p.extension().and_then(|e| e.to_str()), Some("md" | "txt"))
        })
        .collect();
    files.sort();
    files
}

/// Runs `check` on each input; returns the inputs that panicked, with the message.
fn replay(check: fn(&[u8]), files: &[PathBuf]) -> Vec<String> {
    let mut failed = Vec::new();
    for f in files {
        let data = std::fs::read(f).unwrap();
        if let Err(e) = std::panic::catch_unwind(|| check(&data)) {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(format!("{}: {msg}", f.display()));
        }
    }
    failed
}

#[test]
fn every_saved_reproducer_replays_clean() {
    let mut count = 0;
    let mut failed = Vec::new();
    for (name, check) in TARGETS {
        let files = inputs("regressions", name);
        count += files.len();
        failed.extend(replay(*check, &files));
    }
    // The directory holds reproducers of four targets today: a replay that found none
    // would pass without replaying anything.
    assert!(
        count >= 6,
        "only {count} reproducers found under fuzz/regressions/"
    );
    assert!(
        failed.is_empty(),
        "reproducers that still fail:\n{}",
        failed.join("\n")
    );
}

#[test]
fn every_seed_of_every_target_passes_its_checks() {
    let mut failed = Vec::new();
    for (name, check) in TARGETS {
        let files = inputs("corpus", name);
        assert!(!files.is_empty(), "no seeds for {name} under fuzz/corpus/");
        failed.extend(replay(*check, &files));
    }
    assert!(failed.is_empty(), "seeds that fail:\n{}", failed.join("\n"));
}

#[test]
fn a_check_that_panics_is_reported_with_its_file() {
    // The replay must be able to fail: a check that panics on every input.
    fn always(_: &[u8]) {
        panic!("boom");
    }
    let files = inputs("regressions", "amount");
    assert!(!files.is_empty());
    let failed = replay(always, &files);
    assert_eq!(failed.len(), files.len());
    assert!(
        failed[0].contains("amount") && failed[0].ends_with("boom"),
        "{failed:?}"
    );
}
