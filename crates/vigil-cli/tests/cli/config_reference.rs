//! docs/config.md, the configuration reference, cannot drift from the code.
//!
//! The reference has one `## ` section per kind of file (its last code span names it:
//! `lb.toml`, `fleet.toml`, ...), one `### ` heading per TOML table (`[pools.<name>]`,
//! `[[targets]]`; a heading without a bracketed code span is the top level) and under it
//! a table `| key | type | default | meaning |`. The default cell is either one TOML
//! literal in a code span (the default) or free text with an example, `e.g. \`...\``,
//! for keys without a default. `<name>` in a heading stands for any map key. A line
//! `Same keys as \`FILE\` \`[SECTION]\`.` under a heading reuses that section's rows.
//!
//! What is checked, both ways, for every file:
//! - `vigil lb`, `vigil controller` (and its discovery file), `vigil deploy` and the library's
//!   `CheckOptions`/`HealthConfig` derive `Serialize`: a config built by the real loader
//!   from a small TOML (one pool, one route, one target, every optional key set) is
//!   serialised and walked. Every key found must be documented, every documented key
//!   must be found, and every documented default must equal the code's (keys the small
//!   TOML had to set have no default and must be documented as such).
//! - The simulator's scenario types only derive `Deserialize` and `Debug`: their keys are
//!   read from the pretty `Debug` output of a loaded scenario (field names), and each
//!   documented default is proven by loading a scenario with that key set to it and
//!   comparing the result with the scenario loaded without it.
//! - For every file, a TOML built from all documented keys with their documented
//!   defaults or examples loads with the real loader (which denies unknown keys).
//! - Every key used in `examples/` and `scenarios/` is documented, and the example
//!   configurations load with their real loaders.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use toml::{Table, Value};

/// The header of a key table in docs/config.md.
const KEY_TABLE_HEADER: &str = "| key | type | default | meaning |";
/// What stands for a map key (a pool's name) in documented paths.
const ANY_NAME: &str = "<name>";

const LB: &str = "lb.toml";
const FLEET: &str = "fleet.toml";
const DISCOVERY: &str = "fleet-targets.json";
const DEPLOY: &str = "deploy.toml";
const CHECK_OPTIONS: &str = "CheckOptions";
const HEALTH_CONFIG: &str = "HealthConfig";
const SCENARIO: &str = "scenarios/*.toml";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn reference_text() -> String {
    std::fs::read_to_string(root().join("docs/config.md")).expect("docs/config.md exists")
}

// === parsing docs/config.md ===

/// What the default cell says.
#[derive(Clone, Debug)]
enum Default {
    /// A default value.
    Value(Value),
    /// No default; an example value.
    Example(Value),
}

impl Default {
    fn value(&self) -> &Value {
        match self {
            Default::Value(v) | Default::Example(v) => v,
        }
    }
}

/// One documented key.
#[derive(Clone, Debug)]
struct Row {
    /// Full dotted path, `[]` after arrays of tables: `pools.<name>.targets[].addr`.
    key: String,
    /// The section it was documented in (its path prefix) and its key relative to it.
    section: String,
    local: String,
    default: Default,
    line: usize,
}

type Reference = BTreeMap<String, Vec<Row>>;

fn code_spans(s: &str) -> Vec<&str> {
    s.split('`').skip(1).step_by(2).collect()
}

fn toml_literal(lit: &str) -> Result<Value, String> {
    let t: Table =
        toml::from_str(&format!("v = {lit}")).map_err(|e| format!("`{lit}` is not TOML: {e}"))?;
    Ok(t["v"].clone())
}

/// `[a.b]` -> `a.b`, `[[a.b]]` -> `a.b[]`, no bracketed code span -> top level.
fn section_of(heading: &str) -> String {
    match code_spans(heading).first() {
        Some(s) if s.starts_with("[[") => format!("{}[]", s.trim_matches(['[', ']'])),
        Some(s) if s.starts_with('[') => s.trim_matches(['[', ']']).to_string(),
        _ => String::new(),
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn split_row(line: &str) -> Vec<String> {
    let mut cells = Vec::new();
    let mut cur = String::new();
    let mut chars = line.trim().trim_matches('|').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => cur.push(chars.next().unwrap_or('|')),
            '|' => cells.push(std::mem::take(&mut cur).trim().to_string()),
            _ => cur.push(c),
        }
    }
    cells.push(cur.trim().to_string());
    cells
}

fn parse_default(cell: &str) -> Result<Default, String> {
    let spans = code_spans(cell);
    if spans.len() == 1 && cell.starts_with('`') && cell.ends_with('`') {
        return toml_literal(spans[0]).map(Default::Value);
    }
    let Some((_, after)) = cell.split_once("e.g. `") else {
        return Err(format!(
            "default {cell:?} is neither one TOML literal in a code span nor text with \"e.g. `example`\""
        ));
    };
    let example = after.split('`').next().unwrap_or_default();
    toml_literal(example).map(Default::Example)
}

fn parse_reference(text: &str) -> Result<Reference, String> {
    let mut reference = Reference::new();
    let mut file: Option<String> = None;
    let mut section = String::new();
    // Arrays of tables (`[[x]]`) of the current file, whose sub-tables are `x[].y`.
    let mut arrays = std::collections::BTreeSet::<String>::new();
    let mut in_table = false;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let at = |m: String| format!("docs/config.md:{n}: {m}");
        if let Some(h) = line.strip_prefix("## ") {
            file = code_spans(h).last().map(|s| s.to_string());
            section.clear();
            arrays.clear();
            in_table = false;
        } else if let Some(h) = line.strip_prefix("### ") {
            section = section_of(h);
            // `[faults.rollout]` after `[[faults]]`: a table inside each array entry.
            if let Some((head, rest)) = section.split_once('.')
                && arrays.contains(head)
            {
                section = format!("{head}[].{rest}");
            }
            if let Some(array) = section.strip_suffix("[]") {
                arrays.insert(array.to_string());
            }
            in_table = false;
        } else if let Some(rest) = line.strip_prefix("Same keys as ") {
            let [from_file, from_section] = code_spans(rest)[..] else {
                return Err(at("expected \"Same keys as `FILE` `[SECTION]`.\"".into()));
            };
            let from_section = section_of(&format!("`{from_section}`"));
            let copied: Vec<Row> = reference
                .get(from_file)
                .into_iter()
                .flatten()
                .filter(|r| r.section == from_section)
                .map(|r| Row {
                    key: join(&section, &r.local),
                    section: section.clone(),
                    line: n,
                    ..r.clone()
                })
                .collect();
            if copied.is_empty() {
                return Err(at(format!(
                    "no documented keys in `{from_file}` `[{from_section}]` (it must come first)"
                )));
            }
            let f = file
                .clone()
                .ok_or_else(|| at("outside a `## ` section".into()))?;
            reference.entry(f).or_default().extend(copied);
        } else if line.trim() == KEY_TABLE_HEADER {
            in_table = true;
        } else if in_table && line.starts_with("|---") {
            // The header's separator row.
        } else if in_table && line.starts_with('|') {
            let cells = split_row(line);
            let [key, ty, default, meaning] = &cells[..] else {
                return Err(at(format!("expected 4 cells, got {}", cells.len())));
            };
            let local = code_spans(key)
                .first()
                .ok_or_else(|| at(format!("key cell {key:?} has no code span")))?
                .to_string();
            if ty.is_empty() || meaning.is_empty() {
                return Err(at(format!("`{local}`: empty type or meaning")));
            }
            let default = parse_default(default).map_err(|m| at(format!("`{local}`: {m}")))?;
            if ty.contains("duration") {
                let ok = default
                    .value()
                    .as_str()
                    .is_some_and(|s| humantime::parse_duration(s).is_ok());
                if !ok {
                    return Err(at(format!(
                        "`{local}` is a duration but its value is not a duration string"
                    )));
                }
            }
            let f = file
                .clone()
                .ok_or_else(|| at("table outside a `## ` section".into()))?;
            reference.entry(f).or_default().push(Row {
                key: join(&section, &local),
                section: section.clone(),
                local,
                default,
                line: n,
            });
        } else {
            in_table = false;
        }
    }
    for (file, rows) in &reference {
        let mut seen = BTreeSet::new();
        for r in rows {
            if !seen.insert(&r.key) {
                return Err(format!(
                    "docs/config.md:{}: `{}` is documented twice in `{file}`",
                    r.line, r.key
                ));
            }
        }
    }
    Ok(reference)
}

fn reference() -> Reference {
    parse_reference(&reference_text()).unwrap_or_else(|e| panic!("{e}"))
}

fn rows<'a>(reference: &'a Reference, file: &str) -> &'a [Row] {
    reference
        .get(file)
        .unwrap_or_else(|| panic!("docs/config.md has no `## ` section for `{file}`"))
}

// === walking TOML values ===

/// Every leaf key of a value with its value; arrays of tables add `[]` and are walked
/// through all their elements (the first value wins).
fn leaves(v: &Value) -> BTreeMap<String, Value> {
    fn walk(v: &Value, path: &str, out: &mut BTreeMap<String, Value>) {
        match v {
            Value::Table(t) => {
                for (k, x) in t {
                    walk(x, &join(path, k), out);
                }
            }
            Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_table) => {
                for x in a {
                    walk(x, &format!("{path}[]"), out);
                }
            }
            _ => {
                out.entry(path.to_string()).or_insert_with(|| v.clone());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(v, "", &mut out);
    out
}

fn parse_toml(text: &str) -> Value {
    Value::Table(toml::from_str(text).expect("valid TOML"))
}

/// Whether a concrete path (`pools.api.outlier.x`) is the documented one
/// (`pools.<name>.outlier.x`).
fn matches(documented: &str, concrete: &str) -> bool {
    let d: Vec<&str> = documented.split('.').collect();
    let c: Vec<&str> = concrete.split('.').collect();
    d.len() == c.len()
        && d.iter().zip(&c).all(|(d, c)| {
            d == c
                || d.strip_prefix(ANY_NAME)
                    .is_some_and(|rest| rest.is_empty() || c.ends_with(rest))
        })
}

/// Equal, where durations are compared as durations (`"300s"` is `"5m"`).
fn same(doc: &Value, code: &Value) -> bool {
    if doc == code {
        return true;
    }
    match (doc.as_str(), code.as_str()) {
        (Some(a), Some(b)) => matches!(
            (humantime::parse_duration(a), humantime::parse_duration(b)),
            (Ok(x), Ok(y)) if x == y
        ),
        _ => false,
    }
}

/// Compares documented rows with the code's keys, both ways. `code` maps every key of a
/// config loaded from `sample` to its value; the keys `sample` sets have no default.
fn compare(file: &str, rows: &[Row], code: &BTreeMap<String, Value>, sample: &str) -> Vec<String> {
    let explicit = leaves(&parse_toml(sample));
    let mut errors = Vec::new();
    let documented: BTreeMap<&str, &Row> = rows.iter().map(|r| (r.key.as_str(), r)).collect();
    for (key, value) in code {
        let Some(row) = documented
            .iter()
            .find(|(d, _)| matches(d, key))
            .map(|(_, r)| *r)
        else {
            errors.push(format!(
                "{file}: `{key}` (default {value}) is in the code but not in docs/config.md"
            ));
            continue;
        };
        let is_explicit = explicit.contains_key(key);
        match (&row.default, is_explicit) {
            (Default::Value(d), false) if !same(d, value) => errors.push(format!(
                "{file}: docs/config.md:{}: `{}` is documented with default {d}, the code's is {value}",
                row.line, row.key
            )),
            (Default::Example(_), false) => errors.push(format!(
                "{file}: docs/config.md:{}: `{}` is documented without a default, the code's is {value}",
                row.line, row.key
            )),
            (Default::Value(d), true) => errors.push(format!(
                "{file}: docs/config.md:{}: `{}` is documented with default {d} but has none in the code (write \"none, e.g. `...`\")",
                row.line, row.key
            )),
            _ => {}
        }
    }
    for row in rows {
        if !code.keys().any(|k| matches(&row.key, k)) {
            errors.push(format!(
                "{file}: docs/config.md:{}: `{}` is documented but is not a key in the code",
                row.line, row.key
            ));
        }
    }
    errors
}

fn assert_no_errors(errors: Vec<String>) {
    assert!(
        errors.is_empty(),
        "docs/config.md disagrees with the code:\n  {}",
        errors.join("\n  ")
    );
}

/// A TOML table holding every documented key with its default or example; `<name>`
/// becomes `name`.
fn documented_table(rows: &[Row], name: &str) -> Table {
    let mut t = Table::new();
    for r in rows {
        insert(
            &mut t,
            &r.key.replace(ANY_NAME, name),
            r.default.value().clone(),
        );
    }
    t
}

/// Sets `path` (`a.b[].c`) in `t`; `x[]` is the first table of array `x`.
fn insert(t: &mut Table, path: &str, value: Value) {
    let (head, rest) = match path.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (path, None),
    };
    let Some(rest) = rest else {
        t.insert(head.to_string(), value);
        return;
    };
    let child = if let Some(array) = head.strip_suffix("[]") {
        let a = t
            .entry(array)
            .or_insert_with(|| Value::Array(vec![Value::Table(Table::new())]));
        let Value::Array(items) = a else {
            panic!("{array} is not an array")
        };
        if items.is_empty() {
            items.push(Value::Table(Table::new()));
        }
        &mut items[0]
    } else {
        t.entry(head).or_insert_with(|| Value::Table(Table::new()))
    };
    let Value::Table(child) = child else {
        panic!("{head} is not a table")
    };
    insert(child, rest, value);
}

/// The defaults compared with docs/config.md (those of a config loaded from `sample`)
/// are `Config::default()`'s, for every key `Config::default()` has and `sample` does
/// not set.
fn assert_defaults_are_default_impls(
    code: &BTreeMap<String, Value>,
    default: &Value,
    sample: &str,
) {
    let explicit = leaves(&parse_toml(sample));
    let mut compared = 0;
    for (k, v) in leaves(default) {
        if explicit.contains_key(&k) || !code.contains_key(&k) {
            continue;
        }
        assert_eq!(
            code.get(&k),
            Some(&v),
            "`{k}`: the loader's default is not Default's"
        );
        compared += 1;
    }
    assert!(compared >= 10, "only {compared} defaults compared");
}

fn to_value<T: serde::Serialize>(config: &T) -> Value {
    Value::try_from(config).expect("config serialises to TOML")
}

// === vigil lb ===

/// The smallest lb.toml with one of everything and every optional key set.
const LB_SAMPLE: &str = r#"
[timeouts]
per_try = "2s"

[share]
id = "lb-1"

[[routes]]
host = "api.example.com"
path_prefix = "/v1/"
pool = "<name>"

[pools."<name>"]
targets = [{ addr = "127.0.0.1:9001", zone = "a" }]

[pools."<name>".throttle]

[pools."<name>".tls]
ca = "targets-ca.pem"
server_name = "api.internal"
cert = "vigil-client.pem"
key = "vigil-client.key"

[tls_listeners."<name>"]
listen = "127.0.0.1:8443"
certificates = [{ cert = "a.pem", key = "a.key" }]
"#;

fn lb_parse(what: &str, text: &str) -> vigil_lb::config::LbConfig {
    vigil_lb::config::parse(Path::new(what), text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn every_lb_config_key_is_documented_with_its_default() {
    let reference = reference();
    let config = lb_parse("sample lb.toml", LB_SAMPLE);
    let code = leaves(&to_value(&config));
    assert!(
        code.contains_key("pools.<name>.health_check.interval"),
        "{code:?}"
    );
    assert_no_errors(compare(LB, rows(&reference, LB), &code, LB_SAMPLE));
    assert_defaults_are_default_impls(
        &code,
        &to_value(&vigil_lb::config::LbConfig::default()),
        LB_SAMPLE,
    );
}

#[test]
fn every_documented_lb_key_loads_with_the_real_loader() {
    let reference = reference();
    let text = toml::to_string(&documented_table(rows(&reference, LB), "api")).unwrap();
    lb_parse("docs/config.md (lb.toml keys)", &text);
}

// === vigil controller ===

const FLEET_SAMPLE: &str = r#"
api_token = "token"

[probe]
ca_file = "certs/internal-ca.pem"

[heartbeat]
secret = "heartbeat-secret"

[actuator.webhook]
url = "http://127.0.0.1:9500/replace"
secret = "secret"

[actuator.exec]
command = ["/bin/true"]

[discovery]
path = "fleet-targets.json"

[discovery.aws]
groups = ["web-prod"]

[aws]
region = "eu-west-1"
profile = "vigil"
endpoint = "http://127.0.0.1:5000"
autoscaling_endpoint = "https://vpce-0abc-autoscaling.eu-west-1.vpce.amazonaws.com"
ec2_endpoint = "https://vpce-0abc-ec2.eu-west-1.vpce.amazonaws.com"

[store]
url = "postgres://vigil@db:5432/vigil?options=-csearch_path%3Dvigil"

[replicas]
id = "vigil-a"

[[targets]]
id = "web-1"
url = "http://127.0.0.1:8081"
interval = "30s"
"#;

fn fleet_parse(text: &str) -> vigil_controller::config::ControllerConfig {
    let c = vigil_controller::config::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    c.validate().unwrap_or_else(|e| panic!("{e}\n{text}"));
    c
}

#[test]
fn every_controller_config_key_is_documented_with_its_default() {
    let reference = reference();
    let config = fleet_parse(FLEET_SAMPLE);
    let code = leaves(&to_value(&config));
    assert!(code.contains_key("guard.damping.half_life"), "{code:?}");
    assert_no_errors(compare(FLEET, rows(&reference, FLEET), &code, FLEET_SAMPLE));
    assert_defaults_are_default_impls(
        &code,
        &to_value(&vigil_controller::config::ControllerConfig::default()),
        FLEET_SAMPLE,
    );
}

#[test]
fn every_documented_controller_key_loads_with_the_real_loader() {
    let reference = reference();
    let text = toml::to_string(&documented_table(rows(&reference, FLEET), "x")).unwrap();
    fleet_parse(&text);
}

const DISCOVERY_SAMPLE: &str = r#"
[[targets]]
id = "web-3"
url = "http://127.0.0.1:8083"
interval = "30s"
"#;

#[test]
fn every_discovery_file_key_is_documented_with_its_default() {
    let reference = reference();
    let targets =
        vigil_controller::discovery::parse(Path::new("sample.toml"), DISCOVERY_SAMPLE).unwrap();
    let mut t = Table::new();
    t.insert("targets".into(), to_value(&targets));
    let code = leaves(&Value::Table(t));
    assert!(code.contains_key("targets[].zone"), "{code:?}");
    assert_no_errors(compare(
        DISCOVERY,
        rows(&reference, DISCOVERY),
        &code,
        DISCOVERY_SAMPLE,
    ));
}

#[test]
fn every_documented_discovery_key_loads_as_json_and_toml() {
    let reference = reference();
    let t = documented_table(rows(&reference, DISCOVERY), "x");
    let json = serde_json::to_string(&t).unwrap();
    vigil_controller::discovery::parse(Path::new("doc.json"), &json)
        .unwrap_or_else(|e| panic!("{e}"));
    let array = serde_json::to_string(&t["targets"]).unwrap();
    vigil_controller::discovery::parse(Path::new("doc.json"), &array)
        .unwrap_or_else(|e| panic!("{e}"));
    let text = toml::to_string(&t).unwrap();
    vigil_controller::discovery::parse(Path::new("doc.toml"), &text)
        .unwrap_or_else(|e| panic!("{e}"));
}

// === vigil deploy ===

/// The smallest deploy.toml with every optional key set.
const DEPLOY_SAMPLE: &str = r#"
[probe]
error_rate_check = "http:errors"

[install.exec]
command = ["/bin/true"]

[install.webhook]
url = "http://127.0.0.1:9500/install"
secret = "secret"

[drain]
command = ["/bin/true"]
url = "http://127.0.0.1:9401/admin/targets/{host}/drain"
token = "token"

[controller]
url = "http://127.0.0.1:9900"
token = "token"

[[hosts]]
id = "web-1"
url = "http://127.0.0.1:8081"
"#;

fn deploy_parse(text: &str) -> vigil_controller::deploy::config::DeployConfig {
    let c = vigil_controller::deploy::config::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    c.validate().unwrap_or_else(|e| panic!("{e}\n{text}"));
    c
}

#[test]
fn every_deploy_config_key_is_documented_with_its_default() {
    let reference = reference();
    let config = deploy_parse(DEPLOY_SAMPLE);
    let code = leaves(&to_value(&config));
    assert!(code.contains_key("rollout.progress_deadline"), "{code:?}");
    assert_no_errors(compare(
        DEPLOY,
        rows(&reference, DEPLOY),
        &code,
        DEPLOY_SAMPLE,
    ));
    assert_defaults_are_default_impls(
        &code,
        &to_value(&vigil_controller::deploy::config::DeployConfig::default()),
        DEPLOY_SAMPLE,
    );
}

#[test]
fn every_documented_deploy_key_loads_with_the_real_loader() {
    let reference = reference();
    let text = toml::to_string(&documented_table(rows(&reference, DEPLOY), "x")).unwrap();
    deploy_parse(&text);
}

#[test]
fn examples_deploy_toml_loads_with_the_real_loader_and_uses_only_documented_keys() {
    let path = root().join("examples/deploy.toml");
    let c = vigil_controller::deploy::config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.hosts.len() >= 2);
    let v = parse_toml(&std::fs::read_to_string(&path).unwrap());
    assert_no_errors(undocumented_keys(
        Path::new("examples/deploy.toml"),
        &v,
        rows(&reference(), DEPLOY),
    ));
}

// === the library ===

#[test]
fn every_library_option_is_documented_with_its_default() {
    let reference = reference();
    let sample = "gates_startup = true\n";
    let o: vigil::CheckOptions = toml::from_str(sample).unwrap();
    let code = leaves(&to_value(&o));
    assert!(code.contains_key("interval"), "{code:?}");
    let mut errors = compare(
        CHECK_OPTIONS,
        rows(&reference, CHECK_OPTIONS),
        &code,
        sample,
    );
    let c = vigil::HealthConfig::default();
    let code = leaves(&to_value(&c));
    errors.extend(compare(
        HEALTH_CONFIG,
        rows(&reference, HEALTH_CONFIG),
        &code,
        "",
    ));
    assert_no_errors(errors);
}

#[test]
fn every_documented_library_option_loads_with_serde() {
    let reference = reference();
    let text = toml::to_string(&documented_table(rows(&reference, CHECK_OPTIONS), "x")).unwrap();
    let o: vigil::CheckOptions = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    o.validate().unwrap();
    let text = toml::to_string(&documented_table(rows(&reference, HEALTH_CONFIG), "x")).unwrap();
    let c: vigil::HealthConfig = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
    c.validate().unwrap();
}

// === the simulator ===

/// A scenario with one of everything: a queue, a dependency, a fault.
const SCENARIO_SAMPLE: &str = r#"
[queue]

[[dependencies]]
name = "db"

[[faults]]
at = "1m"
kind = "kill"
target = "server:0"
"#;

fn scenario_parse(text: &str) -> vigil_sim::Scenario {
    vigil_sim::Scenario::parse(Path::new("doc.toml"), text)
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The field paths of a pretty `Debug` rendering (`{:#?}`): the scenario types derive
/// `Debug` but not `Serialize`, and derived `Debug` prints every field by name, one per
/// line, nested by indentation. Map keys are quoted and so never taken for fields.
fn debug_field_paths(debug: &str) -> BTreeSet<String> {
    // (indent, path of the field, path its children extend)
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut fields: Vec<String> = Vec::new();
    let mut containers: BTreeSet<String> = BTreeSet::new();
    for line in debug.lines() {
        let indent = line.len() - line.trim_start().len();
        let Some((name, rest)) = line.trim_start().split_once(": ") else {
            continue;
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let parent = stack.last().map(|(_, p)| p.clone()).unwrap_or_default();
        if !parent.is_empty() {
            containers.insert(parent.clone());
        }
        let path = join(&parent, name);
        fields.push(path.clone());
        let child = if rest.starts_with('[') {
            format!("{path}[]")
        } else {
            path
        };
        stack.push((indent, child));
    }
    fields
        .into_iter()
        .filter(|f| !containers.contains(f) && !containers.contains(&format!("{f}[]")))
        .collect()
}

#[test]
fn every_scenario_key_is_documented() {
    let reference = reference();
    let rows = rows(&reference, SCENARIO);
    let s = scenario_parse(SCENARIO_SAMPLE);
    let mut code = debug_field_paths(&format!("{:#?}", s.config));
    assert!(code.contains("faults[].wave_interval"), "{code:?}");
    assert!(
        code.contains("controller.guard.damping.half_life"),
        "{code:?}"
    );
    assert!(code.remove("expect"), "the expectations table: {code:?}");
    for (name, _) in vigil_sim::expect::METRICS
        .iter()
        .chain(vigil_sim::expect::WITHIN)
    {
        code.insert(format!("expect.{name}"));
        code.insert(format!("expect.naive.{name}"));
    }
    let documented: BTreeSet<String> = rows.iter().map(|r| r.key.clone()).collect();
    let mut errors: Vec<String> = code
        .difference(&documented)
        .map(|k| format!("{SCENARIO}: `{k}` is in the code but not in docs/config.md"))
        .collect();
    errors.extend(
        documented
            .difference(&code)
            .map(|k| format!("{SCENARIO}: `{k}` is documented but is not a key in the code")),
    );
    assert_no_errors(errors);
}

#[test]
fn every_documented_scenario_default_is_the_loaders() {
    let reference = reference();
    let sample: Table = toml::from_str(SCENARIO_SAMPLE).unwrap();
    let base = format!("{:#?}", scenario_parse(SCENARIO_SAMPLE).config);
    let mut errors = Vec::new();
    let mut checked = 0;
    for row in rows(&reference, SCENARIO) {
        let Default::Value(v) = &row.default else {
            continue;
        };
        let mut t = sample.clone();
        insert(&mut t, &row.key, v.clone());
        let text = toml::to_string(&t).unwrap();
        match vigil_sim::Scenario::parse(Path::new("doc.toml"), &text) {
            Ok(s) if format!("{:#?}", s.config) == base => checked += 1,
            Ok(_) => errors.push(format!(
                "{SCENARIO}: docs/config.md:{}: `{}` is documented with default {v}, which is not the code's",
                row.line, row.key
            )),
            Err(e) => errors.push(format!(
                "{SCENARIO}: docs/config.md:{}: `{}` = {v} does not load: {e}",
                row.line, row.key
            )),
        }
    }
    assert_no_errors(errors);
    assert!(checked > 40, "only {checked} defaults checked");
}

#[test]
fn every_documented_scenario_key_loads_with_the_real_loader() {
    let reference = reference();
    let text = toml::to_string(&documented_table(rows(&reference, SCENARIO), "x")).unwrap();
    let s = scenario_parse(&text);
    let expectations = vigil_sim::expect::METRICS.len() + vigil_sim::expect::WITHIN.len();
    assert_eq!(s.expect.len(), expectations, "every expectation key parsed");
    assert_eq!(s.expect_naive.len(), expectations);
}

// === the files in the repository ===

fn undocumented_keys(file: &Path, value: &Value, rows: &[Row]) -> Vec<String> {
    leaves(value)
        .into_keys()
        .filter(|k| !rows.iter().any(|r| matches(&r.key, k)))
        .map(|k| format!("{}: `{k}` is not in docs/config.md", file.display()))
        .collect()
}

#[test]
fn examples_and_scenarios_use_only_documented_keys() {
    let reference = reference();
    let mut errors = Vec::new();
    let mut files = 0;
    for (file, id) in [
        ("examples/lb.toml", LB),
        ("examples/fleet.toml", FLEET),
        ("examples/fleet-aws.toml", FLEET),
    ] {
        let path = root().join(file);
        let v = parse_toml(&std::fs::read_to_string(&path).unwrap());
        errors.extend(undocumented_keys(Path::new(file), &v, rows(&reference, id)));
        files += 1;
    }
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("examples/fleet-targets.json")).unwrap(),
    )
    .unwrap();
    let json = if json.is_array() {
        serde_json::json!({ "targets": json })
    } else {
        json
    };
    let v: Value = serde_json::from_value(json).unwrap();
    errors.extend(undocumented_keys(
        Path::new("examples/fleet-targets.json"),
        &v,
        rows(&reference, DISCOVERY),
    ));
    for entry in std::fs::read_dir(root().join("scenarios")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let v = parse_toml(&std::fs::read_to_string(&path).unwrap());
            let shown = Path::new("scenarios").join(path.file_name().unwrap());
            errors.extend(undocumented_keys(&shown, &v, rows(&reference, SCENARIO)));
            files += 1;
        }
    }
    assert_no_errors(errors);
    assert!(files >= 13, "read {files} files");
}

#[test]
fn examples_lb_toml_loads_with_the_real_loader() {
    let c =
        vigil_lb::config::load(&root().join("examples/lb.toml")).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.pools.len() >= 2 && !c.routes.is_empty());
}

#[test]
fn examples_fleet_toml_and_its_targets_file_load_with_the_real_loaders() {
    let c = vigil_controller::config::load(&root().join("examples/fleet.toml"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!c.targets.is_empty());
    let d = c.discovery.expect("the example names a discovery file");
    let targets = vigil_controller::discovery::read(&d.path).unwrap_or_else(|e| panic!("{e}"));
    assert!(!targets.is_empty());
}

#[test]
fn examples_fleet_aws_toml_loads_with_the_real_loader() {
    use vigil_controller::aws::config::AwsActMode;
    let c = vigil_controller::config::load(&root().join("examples/fleet-aws.toml"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.actuator.kind,
        vigil_controller::config::ActuatorKind::AwsAutoscaling
    );
    assert_eq!(c.actuator.aws.mode, AwsActMode::SetUnhealthy);
    let d = c.discovery.expect("the example has [discovery]");
    let aws = d.aws.expect("the example lists Auto Scaling groups");
    assert!(!aws.groups.is_empty());
    assert!(c.aws.region.is_some() && c.aws.profile.is_some());
    assert!(c.targets.is_empty(), "every target comes from the groups");
}

// === the checker itself ===

#[test]
fn the_checker_notices_drift_both_ways() {
    let doc = "## `x`\n\n### `[a]`\n\n| key | type | default | meaning |\n|---|---|---|---|\n\
               | `b` | duration | `\"5m\"` | b |\n| `c` | integer | none, e.g. `3` | c |\n\
               | `gone` | bool | `true` | a removed key |\n";
    let reference = parse_reference(doc).unwrap();
    let rows = rows(&reference, "x");
    let code: BTreeMap<String, Value> = [
        ("a.b".to_string(), Value::String("300s".into())),
        ("a.c".to_string(), Value::Integer(3)),
        ("a.new".to_string(), Value::Integer(1)),
    ]
    .into();
    let errors = compare("x", rows, &code, "[a]\nc = 3\n").join("\n");
    assert!(
        errors.contains("`a.new` (default 1) is in the code but not"),
        "{errors}"
    );
    assert!(
        errors.contains("`a.gone` is documented but is not a key"),
        "{errors}"
    );
    assert!(
        !errors.contains("`a.b`") && !errors.contains("`a.c`"),
        "{errors}"
    );
    let changed: BTreeMap<String, Value> =
        [("a.b".to_string(), Value::String("10m".into()))].into();
    let errors = compare("x", rows, &changed, "").join("\n");
    assert!(
        errors.contains("`a.b` is documented with default \"5m\""),
        "{errors}"
    );
    let debug = "S {\n    a: 1,\n    v: [\n        T {\n            x: Some(\n                2,\n            ),\n        },\n    ],\n    o: Some(\n        U {\n            y: 1s,\n        },\n    ),\n    m: {\n        \"k\": 1,\n    },\n}";
    let paths: Vec<String> = debug_field_paths(debug).into_iter().collect();
    assert_eq!(paths, ["a", "m", "o.y", "v[].x"]);
    assert!(matches("pools.<name>.x", "pools.api.x") && !matches("pools.<name>.x", "pools.x"));
}
