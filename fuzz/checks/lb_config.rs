// The body of fuzz/fuzz_targets/lb_config.rs (its doc says what it checks), kept apart
// so that the same code replays the saved reproducers and seeds as a plain test on
// stable Rust (crates/vigil-cli/tests/cli/fuzz_replay.rs) and runs under libFuzzer.
use std::path::Path;
use vigil_lb::config::{self, ErrorKind};

/// The target's body: never panics on any input, and checks the invariants its fuzz
/// target's doc lists.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("fuzz-lb.toml");
    match config::parse(path, text) {
        Ok(c) => {
            c.validate().expect("a loaded config must validate");
            for pool in c.pools.values() {
                let _ = pool.core();
            }
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(
                shown.starts_with("fuzz-lb.toml"),
                "error must name the file: {shown}"
            );
            let lines = text.lines().count().max(1);
            assert_ne!(e.kind, ErrorKind::Read, "parse reads no file");
            if let Some(line) = e.line {
                assert!(
                    line <= lines + 1,
                    "line {line} past the end ({lines} lines): {shown}"
                );
            }
        }
    }
}
