//! The discovery file: a list of targets in JSON or TOML, polled for changes.
//!
//! JSON: an array of targets, or `{"targets": [...]}`. TOML: `[[targets]]` tables.
//! Each target has the same keys as in the config (`id`, `url`, `zone`, `group`,
//! `heartbeat`). A file that does not parse or validate is reported and ignored: the
//! previous list stays in force. A target missing from a new list is forgotten.

use crate::config::{TargetConfig, validate_targets};
use serde::Deserialize;
use std::path::Path;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Wrapped {
    targets: Vec<TargetConfig>,
}

/// Parses a discovery file's text; the format follows the extension (`.toml`, else
/// JSON). Errors name the file and, from the parsers, the line and key.
pub fn parse(path: &Path, text: &str) -> Result<Vec<TargetConfig>, String> {
    let shown = path.display();
    let is_toml = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("toml"));
    if is_toml {
        // Located like the config's own errors: file:line:column, key, source line.
        let targets = vigil_config::from_str::<Wrapped>(path, text)
            .map_err(|e| e.to_string())?
            .targets;
        validate_targets(&targets, "targets")
            .map_err(|e| vigil_config::invalid(path, text, e).to_string())?;
        return Ok(targets);
    }
    let targets = {
        // Straight into the targets (no `serde_json::Value` tree of a large file first):
        // an array is the list itself, anything else must be `{"targets": [...]}`.
        let r = if text.trim_start().starts_with('[') {
            serde_json::from_str::<Vec<TargetConfig>>(text)
        } else {
            serde_json::from_str::<Wrapped>(text).map(|w| w.targets)
        };
        r.map_err(|e| format!("{shown}: {e}"))?
    };
    validate_targets(&targets, "targets").map_err(|e| format!("{shown}: {e}"))?;
    Ok(targets)
}

/// Reads and parses a discovery file.
pub fn read(path: &Path) -> Result<Vec<TargetConfig>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_array_json_object_and_toml_are_accepted() {
        let a = parse(
            Path::new("d.json"),
            r#"[{"id": "a", "url": "http://127.0.0.1:1", "zone": "z1"}]"#,
        )
        .unwrap();
        assert_eq!(a[0].zone, "z1");
        let b = parse(
            Path::new("d.json"),
            r#"{"targets": [{"id": "w", "heartbeat": true, "group": "workers"}]}"#,
        )
        .unwrap();
        assert!(b[0].heartbeat);
        let c = parse(
            Path::new("d.toml"),
            "[[targets]]\nid = \"a\"\nurl = \"http://127.0.0.1:1\"\n",
        )
        .unwrap();
        assert_eq!(c[0].id, "a");
    }

    #[test]
    fn a_bad_file_is_an_error_naming_file_and_place() {
        let err = parse(
            Path::new("d.toml"),
            "[[targets]]\nid = \"a\"\nurll = \"x\"\n",
        )
        .unwrap_err();
        assert!(
            err.starts_with("d.toml:3:1: key `targets[0].urll`"),
            "{err}"
        );
        let err = parse(
            Path::new("d.toml"),
            "[[targets]]\nid = \"a\"\nurl = \"ftp://x\"\n",
        )
        .unwrap_err();
        assert!(err.starts_with("d.toml:3:1: key `targets[0].url`"), "{err}");
        let err = parse(Path::new("d.json"), r#"[{"id": "a", "url": "ftp://x"}]"#).unwrap_err();
        assert!(err.contains("targets[0].url"), "{err}");
    }
}
