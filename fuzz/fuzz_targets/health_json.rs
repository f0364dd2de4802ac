//! Fuzzes `vigil_core::HealthReport::parse`, the health+json parser every driver (lb,
//! controller, `vigil check`) feeds with bytes from the network.
//!
//! Invariants: never panics; an error has a non-empty message; a parsed report
//! serialises (compact and pretty) to health+json that parses back to the same report,
//! so a report relayed by vigil loses nothing.
#![no_main]

include!("../checks/health_json.rs");

libfuzzer_sys::fuzz_target!(|data: &[u8]| check(data));
