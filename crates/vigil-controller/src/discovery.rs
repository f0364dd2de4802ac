//! The discovery file (a list of targets in JSON or TOML, polled for changes), and how
//! every discovery source fared ([`DiscoveryStatus`]).
//!
//! JSON: an array of targets, or `{"targets": [...]}`. TOML: `[[targets]]` tables.
//! Each target has the same keys as in the config (`id`, `url`, `zone`, `group`,
//! `heartbeat`). A file that does not parse or validate is reported and ignored: the
//! previous list stays in force. A target missing from a new list is forgotten.
//!
//! A source that fails (a rejected file, an unreachable AWS API) keeps its last list:
//! forgetting targets on an error would be the outage. That makes a failing source
//! quiet, so its state is published three ways: an ERROR log line per failure,
//! `GET /api/discovery` (per source: working or not, the last error, since when, the
//! targets kept) and the metrics `vigil_controller_discovery_up{source}`,
//! `vigil_controller_discovery_failures_total{source}` and
//! `vigil_controller_discovery_targets{source}`.
//!
//! A source that works may still leave out what it found: an Auto Scaling instance in
//! service whose health-URL tag is missing or bad is no target (it cannot be probed),
//! and a WARN line alone is easy to miss. Each such instance is listed with why under
//! the source's `skipped` in `GET /api/discovery` (whose summary counts them) and
//! counted by `vigil_controller_discovery_skipped{source}`.

use crate::clock::{rfc3339_ms, wall_ms};
use crate::config::{TargetConfig, validate_targets};
use crate::engine::Source;
use crate::metrics::Metrics;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

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

// === impl DiscoveryStatus ===

/// How each discovery source fared on its last try, shared by the sources (which
/// record) and the API (which shows it); every record also sets the source's metrics.
pub struct DiscoveryStatus {
    sources: Mutex<BTreeMap<&'static str, SourceStatus>>,
    metrics: Arc<Metrics>,
}

/// One source's state, as `GET /api/discovery` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SourceStatus {
    /// `file` or `aws`.
    pub source: &'static str,
    /// Whether the last try gave a list.
    pub ok: bool,
    /// Targets in force from this source: the last list, kept through failures.
    pub targets: usize,
    /// Failed tries since the last good one.
    pub consecutive_failures: u32,
    /// Failed tries since start.
    pub failures: u64,
    /// The last failure's error (kept after a recovery, with its time).
    pub last_error: Option<String>,
    /// When it failed last (RFC 3339 UTC).
    pub last_error_at: Option<String>,
    /// When it last gave a list (RFC 3339 UTC).
    pub last_success_at: Option<String>,
    /// What its last good listing found but left out as targets, and why.
    pub skipped: Vec<Skipped>,
}

/// An instance a source found in service but did not make a target.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Skipped {
    /// Its id (`i-0abc...`).
    pub instance: String,
    /// Its group.
    pub group: String,
    /// Why it is no target.
    pub why: String,
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (group {}): {}", self.instance, self.group, self.why)
    }
}

/// A source's name in the API and the metrics.
pub fn source_name(source: Source) -> &'static str {
    match source {
        Source::Config => "config",
        Source::Discovery => "file",
        Source::Aws => "aws",
    }
}

impl DiscoveryStatus {
    /// No source has reported yet.
    pub fn new(metrics: Arc<Metrics>) -> DiscoveryStatus {
        DiscoveryStatus {
            sources: Mutex::default(),
            metrics,
        }
    }

    fn update(&self, source: Source, f: impl FnOnce(&mut SourceStatus)) -> SourceStatus {
        let name = source_name(source);
        let mut sources = self.sources.lock().expect("discovery status lock");
        let s = sources.entry(name).or_insert_with(|| SourceStatus {
            source: name,
            ok: false,
            targets: 0,
            consecutive_failures: 0,
            failures: 0,
            last_error: None,
            last_error_at: None,
            last_success_at: None,
            skipped: Vec::new(),
        });
        f(s);
        self.metrics
            .discovery(name, s.ok, s.targets, s.skipped.len());
        s.clone()
    }

    /// The source gave a list of `targets`.
    pub fn succeeded(&self, source: Source, targets: usize) {
        self.succeeded_skipping(source, targets, Vec::new());
    }

    /// The source gave a list of `targets`, leaving out `skipped` (kept until its next
    /// good listing: a failed try says nothing new about them).
    pub fn succeeded_skipping(&self, source: Source, targets: usize, skipped: Vec<Skipped>) {
        self.update(source, |s| {
            s.ok = true;
            s.targets = targets;
            s.skipped = skipped;
            s.consecutive_failures = 0;
            s.last_success_at = Some(rfc3339_ms(wall_ms()));
        });
    }

    /// The source failed with `error`; its last list stays in force (`targets` is
    /// left as the last success set it). Returns the failures in a row, this one
    /// included.
    pub fn failed(&self, source: Source, error: &str) -> u32 {
        self.metrics.discovery_failure(source_name(source));
        self.update(source, |s| {
            s.ok = false;
            s.consecutive_failures = s.consecutive_failures.saturating_add(1);
            s.failures = s.failures.saturating_add(1);
            s.last_error = Some(error.to_string());
            s.last_error_at = Some(rfc3339_ms(wall_ms()));
        })
        .consecutive_failures
    }

    /// Every source that has reported, by name.
    pub fn snapshot(&self) -> Vec<SourceStatus> {
        let sources = self.sources.lock().expect("discovery status lock");
        sources.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_keeps_the_count_of_targets_and_a_success_clears_the_streak_not_the_error() {
        let metrics = Arc::new(Metrics::new());
        let st = DiscoveryStatus::new(metrics.clone());
        st.succeeded(Source::Aws, 4);
        assert_eq!(st.failed(Source::Aws, "connection refused"), 1);
        assert_eq!(st.failed(Source::Aws, "connection refused"), 2);
        let s = &st.snapshot()[0];
        assert!(!s.ok && s.targets == 4 && s.failures == 2, "{s:?}");
        assert_eq!(s.last_error.as_deref(), Some("connection refused"));
        let text = metrics.encode_for(None).1;
        assert!(
            text.contains("vigil_controller_discovery_up{source=\"aws\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("vigil_controller_discovery_failures_total{source=\"aws\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("vigil_controller_discovery_targets{source=\"aws\"} 4\n"),
            "{text}"
        );
        st.succeeded(Source::Aws, 5);
        let s = &st.snapshot()[0];
        assert!(
            s.ok && s.consecutive_failures == 0 && s.failures == 2 && s.targets == 5,
            "{s:?}"
        );
        assert!(
            s.last_error.is_some() && s.last_success_at.is_some(),
            "{s:?}"
        );
        assert!(
            metrics
                .encode_for(None)
                .1
                .contains("vigil_controller_discovery_up{source=\"aws\"} 1\n")
        );
    }

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
