//! `CheckResult` and `HealthReport`, serialised and parsed as the health+json draft
//! ("Health Check Response Format for HTTP APIs", `application/health+json`).
//!
//! ```json
//! {"status": "warn",
//!  "checks": {"postgres:responseTime": [{"componentType": "datastore",
//!     "observedValue": 250, "observedUnit": "ms", "status": "warn",
//!     "time": "2026-11-30T07:00:00.000Z", "output": "slow"}]}}
//! ```
//!
//! Parsing is strict about what it needs (a `status` it understands, well-formed `checks`)
//! and lenient about the rest (unknown fields are ignored, as the draft allows). Any input,
//! garbage included, yields either a report or a [`ParseError`] naming the path and what
//! was expected there; it never panics.

use crate::status::{Criticality, Status};
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// The media type of a health+json response.
pub const HEALTH_JSON: &str = "application/health+json";

/// Largest health+json body a driver should read before giving up on it (64 KiB: a
/// service with hundreds of checks fits; a misbehaving endpoint cannot exhaust memory).
pub const MAX_REPORT_BYTES: usize = 64 * 1024;

/// One check's result: one element of a `checks` array in health+json.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckResult {
    /// The check's outcome.
    pub status: Status,
    /// Kind of component checked: `component`, `datastore`, `system`, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub component_type: Option<String>,
    /// Identifier of the checked instance, when a check covers several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub component_id: Option<String>,
    /// What was measured (a number, a string, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_value: Option<Value>,
    /// Unit of `observed_value`, e.g. `ms`, `bytes`, `percent`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_unit: Option<String>,
    /// When the check ran (wall clock, RFC 3339 on the wire).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "serialize_rfc3339"
    )]
    pub time: Option<SystemTime>,
    /// How long the check took (an extension field: `"duration": "12ms"`).
    #[serde(skip_serializing_if = "Option::is_none", with = "humantime_serde")]
    pub duration: Option<Duration>,
    /// Human-readable detail: why it failed, what it saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

impl CheckResult {
    /// A result with only a status.
    pub fn new(status: Status) -> Self {
        CheckResult {
            status,
            component_type: None,
            component_id: None,
            observed_value: None,
            observed_unit: None,
            time: None,
            duration: None,
            output: None,
        }
    }

    /// A failed result with an explanation.
    pub fn fail(output: impl Into<String>) -> Self {
        CheckResult::new(Status::Fail).with_output(output)
    }

    /// Sets the human-readable output.
    pub fn with_output(mut self, output: impl Into<String>) -> Self {
        self.output = Some(output.into());
        self
    }

    /// Sets the observed value and its unit.
    pub fn with_observed(mut self, value: impl Into<Value>, unit: impl Into<String>) -> Self {
        self.observed_value = Some(value.into());
        self.observed_unit = Some(unit.into());
        self
    }

    /// Sets the component type.
    pub fn with_component_type(mut self, kind: impl Into<String>) -> Self {
        self.component_type = Some(kind.into());
        self
    }

    /// Sets when the check ran and how long it took.
    pub fn with_timing(mut self, time: SystemTime, duration: Duration) -> Self {
        self.time = Some(time);
        self.duration = Some(duration);
        self
    }
}

/// A whole service's health: the top-level health+json object.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct HealthReport {
    /// Overall status (the aggregate of the checks, by [`Status::aggregate`]).
    pub status: Status,
    /// Public version of the service.
    pub version: Option<String>,
    /// The release (deployed revision) of the service, the draft's `releaseId`: what
    /// `vigil deploy` reads to see that a host runs a new revision.
    pub release_id: Option<String>,
    /// Human-readable description of the service.
    pub description: Option<String>,
    /// Human-readable detail about the overall status.
    pub output: Option<String>,
    /// Results by check name (`"component:measurement"`), each an array as the draft has it.
    pub checks: BTreeMap<String, Vec<CheckResult>>,
}

impl HealthReport {
    /// Builds a report from named results and their criticality; the overall status is
    /// their aggregate.
    pub fn from_results<I, S>(results: I) -> Self
    where
        I: IntoIterator<Item = (S, CheckResult, Criticality)>,
        S: Into<String>,
    {
        let mut checks: BTreeMap<String, Vec<CheckResult>> = BTreeMap::new();
        let mut weighted = Vec::new();
        for (name, result, criticality) in results {
            weighted.push((result.status, criticality));
            checks.entry(name.into()).or_default().push(result);
        }
        HealthReport {
            status: Status::aggregate(weighted),
            checks,
            ..Default::default()
        }
    }

    /// Names of the checks that have at least one failing result, in name order.
    pub fn failing_checks(&self) -> impl Iterator<Item = &str> {
        self.checks
            .iter()
            .filter(|(_, rs)| rs.iter().any(|r| r.status == Status::Fail))
            .map(|(name, _)| name.as_str())
    }

    /// Serialises as health+json.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a HealthReport always serialises")
    }

    /// Serialises as indented health+json, for humans.
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).expect("a HealthReport always serialises")
    }

    /// Parses a health+json body. See the module docs for what is required.
    pub fn parse(body: &[u8]) -> Result<HealthReport, ParseError> {
        let value: Value = serde_json::from_slice(body).map_err(|e| ParseError::NotJson {
            line: e.line(),
            column: e.column(),
            reason: e.to_string(),
        })?;
        let top = as_object(&value, "$")?;
        let status = parse_status(top, "$")?;
        let mut checks = BTreeMap::new();
        match top.get("checks") {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => {
                for (name, entry) in map {
                    let path = format!("$.checks[{name:?}]");
                    let results = match entry {
                        Value::Array(items) => items
                            .iter()
                            .enumerate()
                            .map(|(i, item)| parse_check(item, &format!("{path}[{i}]")))
                            .collect::<Result<Vec<_>, _>>()?,
                        // Tolerate a single object where the draft wants an array of one.
                        Value::Object(_) => vec![parse_check(entry, &path)?],
                        other => {
                            return Err(ParseError::WrongType {
                                path,
                                expected: "an array of check objects",
                                found: kind(other),
                            });
                        }
                    };
                    checks.insert(name.clone(), results);
                }
            }
            Some(other) => {
                return Err(ParseError::WrongType {
                    path: "$.checks".into(),
                    expected: "an object mapping check names to arrays",
                    found: kind(other),
                });
            }
        }
        Ok(HealthReport {
            status,
            version: opt_string(top, "$", "version")?,
            release_id: opt_string(top, "$", "releaseId")?,
            description: opt_string(top, "$", "description")?,
            output: opt_string(top, "$", "output")?,
            checks,
        })
    }
}

impl Serialize for HealthReport {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("status", &self.status)?;
        if let Some(v) = &self.version {
            map.serialize_entry("version", v)?;
        }
        if let Some(v) = &self.release_id {
            map.serialize_entry("releaseId", v)?;
        }
        if let Some(v) = &self.description {
            map.serialize_entry("description", v)?;
        }
        if let Some(v) = &self.output {
            map.serialize_entry("output", v)?;
        }
        if !self.checks.is_empty() {
            map.serialize_entry("checks", &self.checks)?;
        }
        map.end()
    }
}

/// Why a body is not a health+json report we can use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The body is not JSON at all.
    #[error("not JSON (line {line}, column {column}): {reason}")]
    NotJson {
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// serde_json's explanation.
        reason: String,
    },
    /// A required field is absent.
    #[error("{path}: missing required field")]
    MissingField {
        /// JSON path of the missing field.
        path: String,
    },
    /// A field has the wrong JSON type.
    #[error("{path}: expected {expected}, found {found}")]
    WrongType {
        /// JSON path of the field.
        path: String,
        /// What the draft wants there.
        expected: &'static str,
        /// The JSON type that was there.
        found: &'static str,
    },
    /// A status string that is not pass, warn or fail (or a known alias).
    #[error("{path}: unknown status {value:?}, expected pass, warn or fail")]
    UnknownStatus {
        /// JSON path of the status.
        path: String,
        /// The offending value.
        value: String,
    },
    /// A `time` that is not RFC 3339.
    #[error("{path}: {value:?} is not an RFC 3339 time")]
    BadTime {
        /// JSON path of the time.
        path: String,
        /// The offending value.
        value: String,
    },
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn as_object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>, ParseError> {
    v.as_object().ok_or_else(|| ParseError::WrongType {
        path: path.to_string(),
        expected: "an object",
        found: kind(v),
    })
}

fn parse_status(obj: &Map<String, Value>, path: &str) -> Result<Status, ParseError> {
    let path = format!("{path}.status");
    match obj.get("status") {
        None => Err(ParseError::MissingField { path }),
        Some(Value::String(s)) => s.parse().map_err(|_| ParseError::UnknownStatus {
            path,
            value: s.clone(),
        }),
        Some(other) => Err(ParseError::WrongType {
            path,
            expected: "a string",
            found: kind(other),
        }),
    }
}

fn opt_string(
    obj: &Map<String, Value>,
    path: &str,
    key: &str,
) -> Result<Option<String>, ParseError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        // The draft says strings; numbers and booleans show up in the wild (a version of 2).
        Some(v @ (Value::Number(_) | Value::Bool(_))) => Ok(Some(v.to_string())),
        Some(other) => Err(ParseError::WrongType {
            path: format!("{path}.{key}"),
            expected: "a string",
            found: kind(other),
        }),
    }
}

fn parse_check(v: &Value, path: &str) -> Result<CheckResult, ParseError> {
    let obj = as_object(v, path)?;
    let time = match opt_string(obj, path, "time")? {
        None => None,
        Some(s) => Some(
            humantime::parse_rfc3339_weak(&s).map_err(|_| ParseError::BadTime {
                path: format!("{path}.time"),
                value: s.clone(),
            })?,
        ),
    };
    let duration = match opt_string(obj, path, "duration")? {
        None => None,
        // An extension field of ours: ignore a foreign shape rather than reject the report.
        Some(s) => humantime::parse_duration(&s).ok(),
    };
    Ok(CheckResult {
        status: parse_status(obj, path)?,
        component_type: opt_string(obj, path, "componentType")?,
        component_id: opt_string(obj, path, "componentId")?,
        observed_value: obj.get("observedValue").filter(|v| !v.is_null()).cloned(),
        observed_unit: opt_string(obj, path, "observedUnit")?,
        time,
        duration,
        output: opt_string(obj, path, "output")?,
    })
}

/// Writes a `time` in RFC 3339 with milliseconds, as the draft's examples do, unless the
/// time carries more than that: then with as many digits as it needs (micro- or
/// nanoseconds), so a report parsed from a service and relayed by vigil keeps the time
/// the service sent (truncating it made `parse(serialise(r)) != r`; found by fuzzing).
fn serialize_rfc3339<S: Serializer>(t: &Option<SystemTime>, s: S) -> Result<S::Ok, S::Error> {
    // RFC 3339 as humantime writes it covers 1970..=9999 and it panics outside; a time
    // built in code outside that range is written as `null` (no time) rather than
    // taking the health endpoint down.
    const LAST_RFC3339_SECOND: u64 = 253_402_300_799; // 9999-12-31T23:59:59Z
    let since_epoch = t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
    let (Some(t), Some(since_epoch)) = (*t, since_epoch) else {
        return s.serialize_none();
    };
    if since_epoch.as_secs() > LAST_RFC3339_SECOND {
        return s.serialize_none();
    }
    let nanos = since_epoch.subsec_nanos();
    if nanos % 1_000_000 == 0 {
        s.collect_str(&humantime::format_rfc3339_millis(t))
    } else if nanos % 1_000 == 0 {
        s.collect_str(&humantime::format_rfc3339_micros(t))
    } else {
        s.collect_str(&humantime::format_rfc3339_nanos(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips_through_health_json() {
        let report = HealthReport::from_results([
            (
                "disk:free",
                CheckResult::new(Status::Pass)
                    .with_observed(1234, "bytes")
                    .with_component_type("system")
                    .with_timing(
                        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
                        Duration::from_millis(3),
                    ),
                Criticality::Critical,
            ),
            (
                "postgres:connect",
                CheckResult::fail("connection refused"),
                Criticality::NonCritical,
            ),
        ]);
        assert_eq!(report.status, Status::Warn);
        let json = report.to_json();
        assert!(json.contains("\"observedValue\":1234"), "{json}");
        assert!(
            json.contains("\"time\":\"2027-01-15T08:00:00.000Z\""),
            "{json}"
        );
        let back = HealthReport::parse(json.as_bytes()).unwrap();
        assert_eq!(back, report, "parse(serialise(r)) must give r back");
        assert_eq!(
            back.failing_checks().collect::<Vec<_>>(),
            ["postgres:connect"]
        );
    }

    #[test]
    fn version_and_release_id_round_trip_under_their_draft_names() {
        let report = HealthReport {
            version: Some("1.4".into()),
            release_id: Some("1.4.2-abc".into()),
            ..HealthReport::default()
        };
        let json = report.to_json();
        assert!(json.contains("\"releaseId\":\"1.4.2-abc\""), "{json}");
        assert_eq!(HealthReport::parse(json.as_bytes()).unwrap(), report);
    }

    #[test]
    fn garbage_is_not_json() {
        let err = HealthReport::parse(b"<html>502 Bad Gateway</html>").unwrap_err();
        assert!(matches!(err, ParseError::NotJson { line: 1, .. }), "{err}");
    }

    #[test]
    fn foreign_shape_names_the_path() {
        let err = HealthReport::parse(br#"{"status":"pass","checks":{"db":[{"status":7}]}}"#)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "$.checks[\"db\"][0].status: expected a string, found a number"
        );
        let err = HealthReport::parse(br#"{"healthy":true}"#).unwrap_err();
        assert_eq!(
            err,
            ParseError::MissingField {
                path: "$.status".into()
            }
        );
        let err = HealthReport::parse(br#"{"status":"sideways"}"#).unwrap_err();
        assert!(matches!(err, ParseError::UnknownStatus { .. }), "{err}");
        let err = HealthReport::parse(br#"[1,2]"#).unwrap_err();
        assert!(matches!(err, ParseError::WrongType { .. }), "{err}");
    }

    #[test]
    fn aliases_and_unknown_fields_are_accepted() {
        let r = HealthReport::parse(
            br#"{"status":"UP","serviceId":"x","checks":{"db":{"status":"down","extra":1}}}"#,
        )
        .unwrap();
        assert_eq!(r.status, Status::Pass);
        assert_eq!(r.checks["db"][0].status, Status::Fail);
    }

    #[test]
    fn bad_time_is_reported() {
        let err = HealthReport::parse(
            br#"{"status":"pass","checks":{"a":[{"status":"pass","time":"yesterday"}]}}"#,
        )
        .unwrap_err();
        assert!(matches!(err, ParseError::BadTime { .. }), "{err}");
    }

    #[test]
    fn times_outside_rfc3339_are_written_as_null_not_a_panic() {
        for t in [
            SystemTime::UNIX_EPOCH - Duration::from_secs(1),
            SystemTime::UNIX_EPOCH + Duration::from_secs(300_000_000_000),
        ] {
            let mut r = CheckResult::new(Status::Pass);
            r.time = Some(t);
            let report = HealthReport::from_results([("a", r, Criticality::Critical)]);
            let json = report.to_json();
            assert!(json.contains("\"time\":null"), "{json}");
            assert!(HealthReport::parse(json.as_bytes()).is_ok(), "{json}");
        }
    }

    #[test]
    fn sub_millisecond_times_survive_a_round_trip() {
        // Minimised from the health_json fuzz target (fuzz/regressions/health_json/).
        for (sent, shown) in [
            ("2026-11-30T07:00:00.0005Z", "2026-11-30T07:00:00.000500Z"),
            (
                "2026-11-30T07:00:00.123456789Z",
                "2026-11-30T07:00:00.123456789Z",
            ),
            ("2026-11-30T07:00:00.5Z", "2026-11-30T07:00:00.500Z"),
        ] {
            let body = format!(
                r#"{{"status":"pass","checks":{{"a":[{{"status":"pass","time":"{sent}"}}]}}}}"#
            );
            let report = HealthReport::parse(body.as_bytes()).unwrap();
            let json = report.to_json();
            assert!(
                json.contains(shown),
                "{sent} must be written as {shown}: {json}"
            );
            let back = HealthReport::parse(json.as_bytes()).unwrap();
            assert_eq!(
                back, report,
                "a relayed report must keep the time it was sent"
            );
        }
    }

    proptest! {
        #[test]
        fn parsing_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = HealthReport::parse(&bytes);
        }

        #[test]
        fn parsing_arbitrary_json_never_panics(s in r#"\{"status":("pass"|"warn"|1|null),"checks":\{("a"|"b"):\[?\{"status":"(pass|fail)"(,"time":"[0-9TZ:.-]{0,24}")?\}\]?\}\}"#) {
            let _ = HealthReport::parse(s.as_bytes());
        }
    }
}
