//! Fuzzes the simulator's scenario loader, `vigil_sim::Scenario::parse(file, text)`
//! (TOML, validation and the `[expect]` table), without running the simulation.
//!
//! Invariants: never panics; an error names the file and, when it has a line, one that
//! exists in the text; an accepted scenario's naive variant (what `--compare-naive`
//! runs) can be derived.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use vigil_sim::Scenario;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Scenario::parse(Path::new("fuzz-scenario.toml"), text) {
        Ok(s) => {
            let _ = s.config.naive();
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(
                shown.contains("fuzz-scenario.toml"),
                "error must name the file: {shown}"
            );
            if let Some(line) = e.line {
                let lines = text.lines().count().max(1);
                assert!(
                    line <= lines + 1,
                    "line {line} past the end ({lines} lines): {shown}"
                );
            }
        }
    }
});
