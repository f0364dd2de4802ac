// The body of fuzz/fuzz_targets/health_json.rs (its doc says what it checks), kept apart
// so that the same code replays the saved reproducers and seeds as a plain test on
// stable Rust (crates/vigil-cli/tests/cli/fuzz_replay.rs) and runs under libFuzzer.
use vigil_core::HealthReport;

/// The target's body: never panics on any input, and checks the invariants its fuzz
/// target's doc lists.
pub fn check(data: &[u8]) {
    let report = match HealthReport::parse(data) {
        Ok(r) => r,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "an error must say what is wrong");
            return;
        }
    };
    for json in [report.to_json(), report.to_json_pretty()] {
        let back = HealthReport::parse(json.as_bytes())
            .unwrap_or_else(|e| panic!("vigil's own output must parse: {e}\n{json}"));
        assert_eq!(back, report, "parse(serialise(r)) must give r back\n{json}");
    }
}
