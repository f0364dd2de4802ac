//! Fuzzes the controller's discovery-file parser, `vigil_controller::discovery::parse`,
//! in both of its formats: the first byte of the input picks `.json` (even) or `.toml`
//! (odd), the rest is the file's text.
//!
//! Invariants: never panics; an error names the file; every target of an accepted list
//! validates on its own, and ids are what the list's validation promised.
#![no_main]

include!("../checks/controller_discovery.rs");

libfuzzer_sys::fuzz_target!(|data: &[u8]| check(data));
