//! Fuzzes `vigil_core::HealthReport::parse`, the health+json parser every driver (lb,
//! controller, `vigil check`) feeds with bytes from the network.
//!
//! Invariants: never panics; an error has a non-empty message; a parsed report
//! serialises (compact and pretty) to health+json that parses back to the same report,
//! so a report relayed by vigil loses nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vigil_core::HealthReport;

fuzz_target!(|data: &[u8]| {
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
});
