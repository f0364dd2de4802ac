//! Fuzzes the `vigil lb` config loader, `vigil_lb::config::parse(path, text)` (what
//! `load` and SIGHUP reload call after reading the file).
//!
//! Invariants: never panics; an error names the file and, when it has a line, a line
//! that exists in the text; a config that loads is valid (`validate()` agrees) and its
//! derived pool settings can be built.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use vigil_lb::config::{self, ConfigError};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("fuzz-lb.toml");
    match config::parse(path, text) {
        Ok(c) => {
            c.validate().expect("a loaded config must validate");
            for pool in c.pools.values() {
                let _ = pool.core();
            }
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(
                shown.starts_with("fuzz-lb.toml"),
                "error must name the file: {shown}"
            );
            let lines = text.lines().count().max(1);
            match e {
                ConfigError::Parse { line, .. } | ConfigError::Invalid { line, .. } => {
                    assert!(
                        line <= lines + 1,
                        "line {line} past the end ({lines} lines): {shown}"
                    );
                }
                ConfigError::Read { .. } => unreachable!("parse reads no file"),
            }
        }
    }
});
