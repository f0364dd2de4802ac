// The body of fuzz/fuzz_targets/controller_config.rs (its doc says what it checks), kept apart
// so that the same code replays the saved reproducers and seeds as a plain test on
// stable Rust (crates/vigil-cli/tests/cli/fuzz_replay.rs) and runs under libFuzzer.
use vigil_controller::config;

/// The target's body: never panics on any input, and checks the invariants its fuzz
/// target's doc lists.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match config::parse(text) {
        Ok(c) => {
            if let Err(e) = c.validate() {
                assert!(!e.message.is_empty(), "a refusal must say why");
                assert!(!e.key.is_empty(), "a refusal must name its key");
            }
        }
        Err(e) => assert!(!e.message.is_empty(), "a parse error must say why"),
    }
}
