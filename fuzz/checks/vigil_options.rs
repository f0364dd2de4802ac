// The body of fuzz/fuzz_targets/vigil_options.rs (its doc says what it checks), kept apart
// so that the same code replays the saved reproducers and seeds as a plain test on
// stable Rust (crates/vigil-cli/tests/cli/fuzz_replay.rs) and runs under libFuzzer.
use vigil::{CheckOptions, HealthConfig};

/// The target's body: never panics on any input, and checks the invariants its fuzz
/// target's doc lists.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(o) = toml::from_str::<CheckOptions>(text)
        && let Err(e) = o.validate()
    {
        assert!(e.contains(':'), "a refusal must name the key: {e}");
    }
    if let Ok(c) = toml::from_str::<HealthConfig>(text)
        && let Err(e) = c.validate()
    {
        assert!(e.contains(':'), "a refusal must name the key: {e}");
    }
}
