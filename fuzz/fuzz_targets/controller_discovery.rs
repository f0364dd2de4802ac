//! Fuzzes the controller's discovery-file parser, `vigil_controller::discovery::parse`,
//! in both of its formats: the first byte of the input picks `.json` (even) or `.toml`
//! (odd), the rest is the file's text.
//!
//! Invariants: never panics; an error names the file; every target of an accepted list
//! validates on its own, and ids are what the list's validation promised.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use vigil_controller::{config::validate_targets, discovery};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let path = if selector % 2 == 0 {
        Path::new("fuzz-targets.json")
    } else {
        Path::new("fuzz-targets.toml")
    };
    match discovery::parse(path, text) {
        Ok(targets) => {
            validate_targets(&targets, "targets").expect("an accepted list must validate");
            for (i, t) in targets.iter().enumerate() {
                t.validate(&format!("targets[{i}]"))
                    .expect("each accepted target must validate");
            }
        }
        Err(e) => {
            let shown = path.display().to_string();
            assert!(e.starts_with(&shown), "error must name the file: {e}");
        }
    }
});
