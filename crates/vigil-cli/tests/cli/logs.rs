//! Logs as log shippers read them: with `--log-format json`, one JSON object per line
//! with no duplicate key (a field named `target` would repeat the formatter's own
//! `target`, the module path, and parsers keep only one of them); no ANSI colour codes
//! when stderr is not a terminal.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A JSON value whose every object has distinct keys (serde_json's `Value` would keep
/// the last of two and hide the problem).
struct Distinct;

impl<'de> serde::Deserialize<'de> for Distinct {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DistinctVisitor)
    }
}

struct DistinctVisitor;

impl<'de> Visitor<'de> for DistinctVisitor {
    type Value = Distinct;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Distinct, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!("duplicate key `{key}`")));
            }
            map.next_value::<Distinct>()?;
        }
        Ok(Distinct)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Distinct, A::Error> {
        while seq.next_element::<Distinct>()?.is_some() {}
        Ok(Distinct)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Distinct, E> {
        Ok(Distinct)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Distinct, E> {
        Ok(Distinct)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Distinct, E> {
        Ok(Distinct)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Distinct, E> {
        Ok(Distinct)
    }
    fn visit_str<E>(self, _: &str) -> Result<Distinct, E> {
        Ok(Distinct)
    }
    fn visit_unit<E>(self) -> Result<Distinct, E> {
        Ok(Distinct)
    }
}

struct Lb(Child);

impl Drop for Lb {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `vigil [args] lb` with one target that refuses connections (so the balancer
/// logs the target going unhealthy, a line with the target's id) and returns its
/// stderr lines up to and including that one.
fn lb_log_lines(dir: &Path, args: &[&str]) -> Vec<String> {
    let listen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (listen_addr, admin_addr) = (listen.local_addr().unwrap(), admin.local_addr().unwrap());
    drop((listen, admin));
    let config = dir.join("lb.toml");
    std::fs::write(
        &config,
        format!(
            r#"listen = "{listen_addr}"
admin_listen = "{admin_addr}"

[pools.api]
targets = [{{ addr = "127.0.0.1:1" }}]

[pools.api.health_check]
interval = "100ms"
timeout = "100ms"
unhealthy_threshold = 2
new_targets = "healthy"
"#
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(args)
        .arg("lb")
        .arg("-c")
        .arg(&config)
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start vigil lb");
    let stderr = child.stderr.take().unwrap();
    let _lb = Lb(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut lines = Vec::new();
    for line in BufReader::new(stderr).lines() {
        let line = line.unwrap();
        let done = line.contains("unhealthy");
        lines.push(line);
        if done {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "no 'unhealthy' line within 30s: {lines:#?}"
        );
    }
    panic!("vigil lb exited before logging the target unhealthy: {lines:#?}");
}

#[test]
fn json_logs_are_one_object_per_line_with_distinct_keys() {
    let dir = tempfile::tempdir().unwrap();
    let lines = lb_log_lines(dir.path(), &["--log-format", "json"]);
    for line in &lines {
        assert!(
            !line.contains('\u{1b}'),
            "no colour codes in JSON: {line:?}"
        );
        if let Err(e) = serde_json::from_str::<Distinct>(line) {
            panic!("not one JSON object with distinct keys ({e}): {line}");
        }
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(
            v["timestamp"].is_string() && v["level"].is_string() && v["target"].is_string(),
            "timestamp, level and target (module path) on every line: {line}"
        );
    }
    let last: serde_json::Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(
        last["target_id"], "127.0.0.1:1",
        "the target's id survives, under its own key: {last}"
    );
    assert!(
        last["target"].as_str().unwrap().starts_with("vigil_lb"),
        "`target` stays the module path: {last}"
    );
}

#[test]
fn text_logs_have_no_colour_codes_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let lines = lb_log_lines(dir.path(), &[]);
    for line in &lines {
        assert!(!line.contains('\u{1b}'), "colour codes in a pipe: {line:?}");
    }
}

/// Every crate, not only the paths the tests above reach: no tracing event names a
/// field `target` (nor `level` or `timestamp`, the JSON format's other own keys).
#[test]
fn no_tracing_field_is_named_like_the_json_formatters_own_keys() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut found = Vec::new();
    let mut stack = vec![root.join("crates")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = entry.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "target") {
                    stack.push(p);
                }
                continue;
            }
            if p.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            for (i, line) in text.lines().enumerate() {
                let code = line.trim_start();
                if code.starts_with("//") {
                    continue;
                }
                for key in ["target", "level", "timestamp"] {
                    // `key = %x` or `key = ?x`: tracing's display and debug field forms
                    // (SQL's `target = ?1` is not one).
                    for form in ['%', '?'] {
                        let pat = format!("{key} = {form}");
                        let hit = code.match_indices(&pat).any(|(at, _)| {
                            let before = code[..at].chars().next_back();
                            let after = code[at + pat.len()..].chars().next();
                            before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
                                && after.is_some_and(|c| !c.is_ascii_digit())
                        });
                        if hit {
                            found.push(format!("{}:{}: {code}", p.display(), i + 1));
                        }
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "fields that collide with the JSON log format's keys (rename to target_id, ...):\n{}",
        found.join("\n")
    );
}
