//! Fuzzes `vigil::checks::Amount`'s `FromStr` (`"10%"`, `"512MiB"`, `"2GB"`, `"4096"`),
//! the disk check's levels as an operator writes them.
//!
//! Invariants: never panics; a percentage is finite and within 0..=100; what `Display`
//! prints parses back: exactly for a percentage, to within the 0.05-unit rounding of
//! the one decimal it shows for bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vigil::checks::Amount;

fuzz_target!(|data: &[u8]| {
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
});
