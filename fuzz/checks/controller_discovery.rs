// The body of fuzz/fuzz_targets/controller_discovery.rs (its doc says what it checks), kept apart
// so that the same code replays the saved reproducers and seeds as a plain test on
// stable Rust (crates/vigil-cli/tests/cli/fuzz_replay.rs) and runs under libFuzzer.
use std::path::Path;
use vigil_controller::{config::validate_targets, discovery};

/// The target's body: never panics on any input, and checks the invariants its fuzz
/// target's doc lists.
pub fn check(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let path = if selector % 2 == 0 {
        Path::new("fuzz-targets.json")
    } else {
        Path::new("fuzz-targets.toml")
    };
    match discovery::parse(path, text) {
        Ok(targets) => {
            validate_targets(&targets, "targets").expect("an accepted list must validate");
            for (i, t) in targets.iter().enumerate() {
                t.validate(&format!("targets[{i}]"))
                    .expect("each accepted target must validate");
            }
        }
        Err(e) => {
            let shown = path.display().to_string();
            assert!(e.starts_with(&shown), "error must name the file: {e}");
        }
    }
}
