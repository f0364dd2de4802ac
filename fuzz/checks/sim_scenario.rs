// The body of fuzz/fuzz_targets/sim_scenario.rs (its doc says what it checks), kept apart
// so that the same code replays the saved reproducers and seeds as a plain test on
// stable Rust (crates/vigil-cli/tests/cli/fuzz_replay.rs) and runs under libFuzzer.
use std::path::Path;
use vigil_sim::Scenario;

/// The target's body: never panics on any input, and checks the invariants its fuzz
/// target's doc lists.
pub fn check(data: &[u8]) {
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
}
