//! Fuzzes `vigil::checks::Amount`'s `FromStr` (`"10%"`, `"512MiB"`, `"2GB"`, `"4096"`),
//! the disk check's levels as an operator writes them.
//!
//! Invariants: never panics; a percentage is finite and within 0..=100; what `Display`
//! prints parses back: exactly for a percentage, to within the 0.05-unit rounding of
//! the one decimal it shows for bytes.
#![no_main]

include!("../checks/amount.rs");

libfuzzer_sys::fuzz_target!(|data: &[u8]| check(data));
