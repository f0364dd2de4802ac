//! Fuzzes the simulator's scenario loader, `vigil_sim::Scenario::parse(file, text)`
//! (TOML, validation and the `[expect]` table), without running the simulation.
//!
//! Invariants: never panics; an error names the file and, when it has a line, one that
//! exists in the text; an accepted scenario's naive variant (what `--compare-naive`
//! runs) can be derived.
#![no_main]

include!("../checks/sim_scenario.rs");

libfuzzer_sys::fuzz_target!(|data: &[u8]| check(data));
