//! Fuzzes the library's TOML-facing settings: `vigil::CheckOptions` and
//! `vigil::HealthConfig` as a service would load them from its own config file
//! (`toml::from_str`, then `validate()`).
//!
//! Invariants: never panics; `validate()` either passes or names the bad key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vigil::{CheckOptions, HealthConfig};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(o) = toml::from_str::<CheckOptions>(text)
        && let Err(e) = o.validate()
    {
        assert!(e.contains(':'), "a refusal must name the key: {e}");
    }
    if let Ok(c) = toml::from_str::<HealthConfig>(text)
        && let Err(e) = c.validate()
    {
        assert!(e.contains(':'), "a refusal must name the key: {e}");
    }
});
