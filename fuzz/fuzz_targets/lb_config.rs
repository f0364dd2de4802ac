//! Fuzzes the `vigil lb` config loader, `vigil_lb::config::parse(path, text)` (what
//! `load` and SIGHUP reload call after reading the file).
//!
//! Invariants: never panics; an error names the file and, when it has a line, a line
//! that exists in the text; a config that loads is valid (`validate()` agrees) and its
//! derived pool settings can be built.
#![no_main]

include!("../checks/lb_config.rs");

libfuzzer_sys::fuzz_target!(|data: &[u8]| check(data));
