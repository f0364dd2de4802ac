// The body of fuzz/fuzz_targets/amount.rs (its doc says what it checks), kept apart
// so that the same code replays the saved reproducers and seeds as a plain test on
// stable Rust (crates/vigil-cli/tests/cli/fuzz_replay.rs) and runs under libFuzzer.
use vigil::checks::Amount;

/// The target's body: never panics on any input, and checks the invariants its fuzz
/// target's doc lists.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(amount) = text.parse::<Amount>() else {
        return;
    };
    let shown = amount.to_string();
    let back: Amount = shown
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} parsed as {amount:?}, shown as {shown:?}: {e}"));
    match (amount, back) {
        (Amount::Percent(p), Amount::Percent(q)) => {
            assert!(
                p.is_finite() && (0.0..=100.0).contains(&p),
                "{text:?} -> {p}"
            );
            assert_eq!(p, q, "{text:?} shown as {shown:?}");
        }
        (Amount::Bytes(a), Amount::Bytes(b)) => {
            // One decimal of a power-of-1024 unit: off by at most 0.05 of that unit.
            let unit = (a.max(1) as f64).log(1024.0).floor().clamp(0.0, 5.0);
            let tolerance = 0.05 * 1024f64.powf(unit) + 1.0;
            assert!(
                (a as f64 - b as f64).abs() <= tolerance,
                "{text:?} = {a} bytes, shown as {shown:?} = {b} bytes"
            );
        }
        _ => panic!("{text:?} changed kind when shown as {shown:?}"),
    }
}
