//! Fuzzes the `vigil controller` config parser, `vigil_controller::config::parse(text)`
//! followed by `validate()` (exactly what `load` does after reading the file, minus the
//! resolution of relative paths against the file's directory).
//!
//! Invariants: never panics; errors are non-empty; validation of a parsed config
//! either passes or names what is wrong.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vigil_controller::config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match config::parse(text) {
        Ok(c) => {
            if let Err(e) = c.validate() {
                assert!(!e.is_empty(), "a refusal must say why");
            }
        }
        Err(e) => assert!(!e.is_empty(), "a parse error must say why"),
    }
});
