//! Fuzzes the library's TOML-facing settings: `vigil::CheckOptions` and
//! `vigil::HealthConfig` as a service would load them from its own config file
//! (`toml::from_str`, then `validate()`).
//!
//! Invariants: never panics; `validate()` either passes or names the bad key.
#![no_main]

include!("../checks/vigil_options.rs");

libfuzzer_sys::fuzz_target!(|data: &[u8]| check(data));
