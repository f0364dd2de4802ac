//! Fuzzes the `vigil controller` config parser, `vigil_controller::config::parse(text)`
//! followed by `validate()` (exactly what `load` does after reading the file, minus the
//! resolution of relative paths against the file's directory).
//!
//! Invariants: never panics; errors are non-empty; validation of a parsed config
//! either passes or names what is wrong.
#![no_main]

include!("../checks/controller_config.rs");

libfuzzer_sys::fuzz_target!(|data: &[u8]| check(data));
