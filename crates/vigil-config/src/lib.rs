//! vigil's TOML files (`lb.toml`, `fleet.toml`, simulator scenarios): parse them, validate
//! them, and say exactly where a problem is.
//!
//! One implementation for every driver: a [`ConfigError`] names the file, the line and
//! column, the key path (`pools.api.targets[1].addr`) and shows the offending line, for
//! all three kinds of problem:
//!
//! - the file cannot be read ([`ErrorKind::Read`]);
//! - it is not TOML, a value has the wrong type, or a key is unknown
//!   ([`ErrorKind::Parse`], located by the parser's span; the key is the innermost one
//!   whose key or value holds that span);
//! - a value is out of range ([`ErrorKind::Invalid`]): validation returns a
//!   [`vigil_core::Invalid`] with a key path, and [`invalid`] finds that path in the
//!   text (as deep as it exists: a key left at its default is shown at its table).
//!
//! Every validation error is reported, not only the first, as rustc reports every error
//! it finds ([`invalid_all`]): the first is the error itself, the others follow it.
//! A parse error stops at the first: serde gives up at it, and a file that does not
//! parse has no values to validate.
//!
//! [`try_bind`] checks that a listen address can be bound, as `nginx -t` does: a
//! `check-config` that passes a port already taken passes a daemon that cannot start.
//!
//! ```
//! use std::path::Path;
//! #[derive(serde::Deserialize, Debug)]
//! #[serde(deny_unknown_fields)]
//! struct Conf { probe: Probe }
//! #[derive(serde::Deserialize, Debug)]
//! #[serde(deny_unknown_fields)]
//! struct Probe { jitter: f64 }
//!
//! let text = "[probe]\njitter = 0.9\n";
//! let conf: Conf = vigil_config::from_str(Path::new("fleet.toml"), text).unwrap();
//! let bad = vigil_core::Invalid::new("jitter", "must be at most 0.5").within("probe");
//! let e = vigil_config::invalid(Path::new("fleet.toml"), text, bad);
//! assert_eq!(
//!     e.to_string(),
//!     "fleet.toml:2:1: key `probe.jitter`: must be at most 0.5\n    2 | jitter = 0.9"
//! );
//! # let _ = conf.probe.jitter;
//! ```

use serde::de::DeserializeOwned;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::Spanned;
use toml::de::{DeTable, DeValue};
use vigil_core::Invalid;

/// What kind of problem a [`ConfigError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The file could not be read at all (not a content problem).
    Read,
    /// Not valid TOML, a value of the wrong type, or an unknown key.
    Parse,
    /// Valid TOML, but a value that cannot be used.
    Invalid,
}

/// A configuration file that cannot be used: where and why (its fields are those of
/// [`Located`], boxed: an error is rare, a `Result` is everywhere). It may carry more
/// problems of the same file after the first ([`ConfigError::all`]); it derefs to the
/// first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(Box<Located>, Vec<Located>);

impl ConfigError {
    /// Every problem, the first one first.
    pub fn all(&self) -> impl Iterator<Item = &Located> {
        std::iter::once(&*self.0).chain(&self.1)
    }

    /// How many problems it holds (at least one).
    pub fn count(&self) -> usize {
        1 + self.1.len()
    }
}

impl std::ops::Deref for ConfigError {
    type Target = Located;
    fn deref(&self) -> &Located {
        &self.0
    }
}

impl From<Located> for ConfigError {
    fn from(l: Located) -> Self {
        ConfigError(Box::new(l), Vec::new())
    }
}

/// Where and why a configuration file cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    /// What kind of problem.
    pub kind: ErrorKind,
    /// The file.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// The key path, e.g. `faults[2].at`, when known.
    pub key: Option<String>,
    /// What is wrong (and what was expected).
    pub message: String,
    /// The offending line's text.
    pub source_line: Option<String>,
}

impl fmt::Display for Located {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
            if let Some(c) = self.column {
                write!(f, ":{c}")?;
            }
        }
        f.write_str(": ")?;
        if let Some(k) = &self.key {
            write!(f, "key `{k}`: ")?;
        }
        f.write_str(&self.message)?;
        if let (Some(l), Some(s)) = (self.line, &self.source_line) {
            write!(f, "\n{l:>5} | {s}")?;
        }
        Ok(())
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)?;
        for more in &self.1 {
            write!(f, "\n{more}")?;
        }
        if !self.1.is_empty() {
            write!(f, "\n{}: {} problems", self.0.file.display(), self.count())?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Reads a file's text.
pub fn read(file: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(file).map_err(|e| {
        Located {
            kind: ErrorKind::Read,
            file: file.to_path_buf(),
            line: None,
            column: None,
            key: None,
            message: format!("cannot read: {e}"),
            source_line: None,
        }
        .into()
    })
}

/// Parses TOML text into `T` (`file` is used in errors only).
pub fn from_str<T: DeserializeOwned>(file: &Path, text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let at = e.span().map(|s| s.start);
        let (line, column) = at.map(|o| line_col(text, o)).unzip();
        Located {
            kind: ErrorKind::Parse,
            file: file.to_path_buf(),
            line,
            column,
            key: at.and_then(|o| key_at(text, o)),
            message: e.message().trim().to_string(),
            source_line: line.and_then(|l| line_text(text, l)),
        }
        .into()
    })
}

/// Reads and parses a file.
pub fn load<T: DeserializeOwned>(file: &Path) -> Result<T, ConfigError> {
    from_str(file, &read(file)?)
}

/// The validation error `e` located in `text`: at its key, or at the deepest part of
/// its key path the file has (a key left at its default has no line of its own; then
/// its table's, or none).
pub fn invalid(file: &Path, text: &str, e: Invalid) -> ConfigError {
    let span = key_span(text, &e.key);
    let (line, column) = span.map(|s| line_col(text, s.start)).unzip();
    Located {
        kind: ErrorKind::Invalid,
        file: file.to_path_buf(),
        line,
        column,
        key: (!e.key.is_empty()).then_some(e.key),
        message: e.message,
        source_line: line.and_then(|l| line_text(text, l)),
    }
    .into()
}

/// Every validation error of `errs` located in `text` ([`invalid`]): Ok when there is
/// none, else one error holding them all, in the order given.
pub fn invalid_all(
    file: &Path,
    text: &str,
    errs: impl IntoIterator<Item = Invalid>,
) -> Result<(), ConfigError> {
    let mut all = errs.into_iter().map(|e| *invalid(file, text, e).0);
    match all.next() {
        None => Ok(()),
        Some(first) => Err(ConfigError(Box::new(first), all.collect())),
    }
}

/// Checks that `addr` (the value of key `key`) can be listened on now, by binding it
/// and letting it go at once. Port 0 always can. The error names the address and, where
/// this process can see it (Linux, `/proc`), the process holding it.
///
/// A port held by the running `vigil <daemon>` itself (the same command name and
/// subcommand: `check-config` before a reload, while the daemon runs) is not an error:
/// a reload keeps its listeners. Only a restart would need the port, and then the
/// daemon has let it go.
pub fn try_bind(key: &str, addr: std::net::SocketAddr, daemon: &str) -> Result<(), Invalid> {
    match std::net::TcpListener::bind(addr) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => match holder(addr) {
            Some(h) if h.is_this(daemon) => Ok(()),
            Some(h) => Err(Invalid::new(
                key,
                format!(
                    "{addr} is already in use by {} (pid {}): the daemon could not listen there",
                    h.name, h.pid
                ),
            )),
            None => Err(Invalid::new(
                key,
                format!(
                    "{addr} is already in use by another process: the daemon could not listen there"
                ),
            )),
        },
        Err(e) => Err(Invalid::new(key, format!("cannot listen on {addr}: {e}"))),
    }
}

/// The process listening on an address, as `/proc` shows it.
#[derive(Debug)]
struct Holder {
    pid: i32,
    /// Its command name (`comm`).
    name: String,
    /// Its arguments (a vigil daemon's include its subcommand: `lb`, `controller`).
    args: Vec<String>,
}

impl Holder {
    /// Whether it is `vigil <daemon>`, this very command's daemon running.
    fn is_this(&self, daemon: &str) -> bool {
        my_name().is_some_and(|name| name == self.name) && self.args.iter().any(|a| a == daemon)
    }
}

#[cfg(target_os = "linux")]
fn my_name() -> Option<String> {
    procfs::process::Process::myself()
        .and_then(|p| p.stat())
        .ok()
        .map(|s| s.comm)
}

#[cfg(not(target_os = "linux"))]
fn my_name() -> Option<String> {
    None
}

/// Who listens on `addr` now (its port, on its address or on every address), if this
/// process may read the holder's file descriptors.
#[cfg(target_os = "linux")]
fn holder(addr: std::net::SocketAddr) -> Option<Holder> {
    use procfs::net::TcpState;
    use procfs::process::FDTarget;
    let same = |a: std::net::SocketAddr| {
        a.port() == addr.port()
            && (a.ip().is_unspecified() || addr.ip().is_unspecified() || a.ip() == addr.ip())
    };
    let inodes: Vec<u64> = procfs::net::tcp()
        .unwrap_or_default()
        .into_iter()
        .chain(procfs::net::tcp6().unwrap_or_default())
        .filter(|e| e.state == TcpState::Listen && same(e.local_address))
        .map(|e| e.inode)
        .collect();
    if inodes.is_empty() {
        return None;
    }
    for p in procfs::process::all_processes().ok()?.flatten() {
        let Ok(fds) = p.fd() else { continue };
        let holds = fds
            .flatten()
            .any(|fd| matches!(fd.target, FDTarget::Socket(i) if inodes.contains(&i)));
        if holds {
            return Some(Holder {
                pid: p.pid,
                name: p.stat().map(|s| s.comm).unwrap_or_else(|_| "?".into()),
                args: p
                    .cmdline()
                    .map(|c| c.into_iter().skip(1).collect())
                    .unwrap_or_default(),
            });
        }
    }
    None
}

#[cfg(not(target_os = "linux"))]
fn holder(_addr: std::net::SocketAddr) -> Option<Holder> {
    None
}

/// 1-based line and column of a byte offset.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = floor_char_boundary(text, offset.min(text.len()));
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before[before.rfind('\n').map_or(0, |i| i + 1)..]
        .chars()
        .count()
        + 1;
    (line, column)
}

fn floor_char_boundary(text: &str, mut i: usize) -> usize {
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn line_text(text: &str, line: usize) -> Option<String> {
    text.lines()
        .nth(line.checked_sub(1)?)
        .map(|l| l.trim_end().to_string())
}

/// One step of a key path.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

/// Splits `pools.api.targets[1].addr` into its steps. A quoted key (`pools."a.b"`) is
/// one step.
fn split_key(key: &str) -> Vec<Seg> {
    let mut segs = Vec::new();
    let mut cur = String::new();
    let mut chars = key.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '.' if !quoted => {
                if !cur.is_empty() {
                    segs.push(Seg::Key(std::mem::take(&mut cur)));
                }
            }
            '[' if !quoted => {
                if !cur.is_empty() {
                    segs.push(Seg::Key(std::mem::take(&mut cur)));
                }
                let mut n = String::new();
                for d in chars.by_ref() {
                    if d == ']' {
                        break;
                    }
                    n.push(d);
                }
                match n.parse() {
                    Ok(i) => segs.push(Seg::Index(i)),
                    Err(_) => segs.push(Seg::Key(n)),
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        segs.push(Seg::Key(cur));
    }
    segs
}

/// The span of the deepest part of `key` present in the document.
pub fn key_span(text: &str, key: &str) -> Option<Range<usize>> {
    let doc = DeTable::parse(text).ok()?;
    span_in_table(doc.get_ref(), &split_key(key))
}

fn span_in_table(table: &DeTable<'_>, path: &[Seg]) -> Option<Range<usize>> {
    let (first, rest) = path.split_first()?;
    let Seg::Key(k) = first else { return None };
    let (key, value) = table.iter().find(|(key, _)| key.get_ref() == k)?;
    if rest.is_empty() {
        return Some(key.span());
    }
    span_in_value(value, rest).or(Some(key.span()))
}

fn span_in_value(v: &Spanned<DeValue<'_>>, path: &[Seg]) -> Option<Range<usize>> {
    let Some((first, rest)) = path.split_first() else {
        return Some(v.span());
    };
    match (v.get_ref(), first) {
        (DeValue::Table(t), Seg::Key(_)) => span_in_table(t, path),
        (DeValue::Array(a), Seg::Index(i)) => {
            let item = a.get(*i)?;
            span_in_value(item, rest).or(Some(item.span()))
        }
        _ => None,
    }
}

/// The key path of the innermost key whose key or value holds `offset`. Parent spans
/// are not trusted to hold their children (a `[a.b]` header defines `a` implicitly, and
/// a `[table]`'s own span covers only its header), so the whole document is searched and
/// the deepest match wins. A document that does not fully parse is searched as far as
/// it does.
pub fn key_at(text: &str, offset: usize) -> Option<String> {
    let (doc, _) = DeTable::parse_recoverable(text);
    let mut best: Option<(usize, String)> = None;
    walk_table(doc.get_ref(), offset, "", 0, &mut best);
    best.map(|(_, p)| p)
}

fn walk_table(
    t: &DeTable<'_>,
    offset: usize,
    prefix: &str,
    depth: usize,
    best: &mut Option<(usize, String)>,
) {
    for (k, v) in t.iter() {
        let path = if prefix.is_empty() {
            k.get_ref().to_string()
        } else {
            format!("{prefix}.{}", k.get_ref())
        };
        let hit = k.span().contains(&offset) || v.span().contains(&offset);
        if hit && best.as_ref().is_none_or(|(d, _)| *d <= depth) {
            *best = Some((depth, path.clone()));
        }
        walk_value(v, offset, &path, depth + 1, best);
    }
}

fn walk_value(
    v: &Spanned<DeValue<'_>>,
    offset: usize,
    path: &str,
    depth: usize,
    best: &mut Option<(usize, String)>,
) {
    match v.get_ref() {
        DeValue::Table(t) => walk_table(t, offset, path, depth, best),
        DeValue::Array(a) => {
            for (i, item) in a.iter().enumerate() {
                let p = format!("{path}[{i}]");
                if item.span().contains(&offset) && best.as_ref().is_none_or(|(d, _)| *d <= depth) {
                    *best = Some((depth, p.clone()));
                }
                walk_value(item, offset, &p, depth + 1, best);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::time::Duration;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Conf {
        #[serde(default)]
        pools: std::collections::BTreeMap<String, Pool>,
        #[serde(default)]
        probe: Probe,
    }

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Probe {
        #[serde(default, with = "humantime_serde")]
        interval: Option<Duration>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Pool {
        targets: Vec<Target>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Target {
        addr: String,
        #[serde(default)]
        weight: u32,
    }

    const TEXT: &str = "[probe]\ninterval = \"1s\"\n\n[pools.api]\ntargets = [\n  { addr = \"a:1\" },\n  { addr = \"b:2\", weight = 3 },\n]\n";

    #[test]
    fn a_validation_error_is_found_at_its_key_or_its_deepest_part() {
        let f = Path::new("lb.toml");
        let e = invalid(f, TEXT, Invalid::new("pools.api.targets[1].addr", "bad"));
        assert_eq!((e.line, e.column), (Some(7), Some(5)), "{e}");
        assert_eq!(
            e.source_line.as_deref(),
            Some("  { addr = \"b:2\", weight = 3 },")
        );
        assert_eq!(e.kind, ErrorKind::Invalid);
        // Absent key: its table's line.
        let e = invalid(f, TEXT, Invalid::new("pools.api.hedge.quantile", "bad"));
        assert_eq!(e.line, Some(4), "{e}");
        assert_eq!(e.key.as_deref(), Some("pools.api.hedge.quantile"));
        // Nothing of it in the file: no line, the key still named.
        let e = invalid(
            f,
            TEXT,
            Invalid::new("guard.budget.per", "must be longer than 0s"),
        );
        assert_eq!(e.line, None);
        assert_eq!(
            e.to_string(),
            "lb.toml: key `guard.budget.per`: must be longer than 0s"
        );
    }

    #[test]
    fn a_parse_error_names_line_column_and_the_innermost_key() {
        let f = Path::new("lb.toml");
        let bad = TEXT.replace("weight = 3", "weight = \"x\"");
        let e = from_str::<Conf>(f, &bad).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Parse);
        assert_eq!(e.line, Some(7), "{e}");
        assert_eq!(e.key.as_deref(), Some("pools.api.targets[1].weight"), "{e}");
        let e = from_str::<Conf>(f, "[probe]\nintervall = \"2s\"\n").unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(2), Some("probe.intervall")),
            "{e}"
        );
        assert!(e.message.contains("unknown field"), "{e}");
        let e = from_str::<Conf>(f, "[probe\n").unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
        assert!(from_str::<Conf>(f, TEXT).is_ok());
    }

    #[test]
    fn an_unreadable_file_is_a_read_error() {
        let e = load::<Conf>(Path::new("/nonexistent/vigil.toml")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Read);
        assert!(
            e.to_string()
                .starts_with("/nonexistent/vigil.toml: cannot read")
        );
    }

    #[test]
    fn every_validation_error_is_reported_in_order() {
        let f = Path::new("lb.toml");
        assert_eq!(invalid_all(f, TEXT, Vec::new()), Ok(()));
        let e = invalid_all(
            f,
            TEXT,
            [
                Invalid::new("probe.interval", "too short"),
                Invalid::new("pools.api.targets[1].weight", "too heavy"),
            ],
        )
        .unwrap_err();
        assert_eq!(e.count(), 2);
        let lines: Vec<_> = e.all().map(|l| (l.line, l.key.clone())).collect();
        assert_eq!(
            lines,
            [
                (Some(2), Some("probe.interval".to_string())),
                (Some(7), Some("pools.api.targets[1].weight".to_string()))
            ]
        );
        assert_eq!(
            e.to_string(),
            "lb.toml:2:1: key `probe.interval`: too short\n    2 | interval = \"1s\"\n\
             lb.toml:7:19: key `pools.api.targets[1].weight`: too heavy\n    7 |   { addr = \"b:2\", weight = 3 },\n\
             lb.toml: 2 problems"
        );
        assert_eq!(
            e.key.as_deref(),
            Some("probe.interval"),
            "derefs to the first"
        );
    }

    #[test]
    fn a_listen_address_in_use_is_refused_naming_key_and_address() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let e = try_bind("listen", addr, "lb").unwrap_err();
        assert_eq!(e.key, "listen");
        assert!(
            e.message.contains(&addr.to_string()) && e.message.contains("already in use"),
            "{}",
            e.message
        );
        #[cfg(target_os = "linux")]
        assert!(
            e.message.contains(&format!("(pid {})", std::process::id())),
            "the holder, this test, is named: {}",
            e.message
        );
        drop(taken);
        assert_eq!(try_bind("listen", addr, "lb"), Ok(()), "a free port passes");
        assert_eq!(
            try_bind("listen", "127.0.0.1:0".parse().unwrap(), "lb"),
            Ok(())
        );
    }

    #[test]
    fn columns_count_characters_and_offsets_past_the_end_are_clamped() {
        assert_eq!(line_col("é = 1\nab", 7), (2, 1));
        assert_eq!(line_col("é = 1", 2), (1, 2));
        assert_eq!(line_col("ab", 99), (1, 3));
        assert_eq!(line_col("é", 1), (1, 1), "inside a character: its start");
    }

    #[test]
    fn key_paths_split_on_dots_and_indexes_but_not_inside_quotes() {
        assert_eq!(
            split_key("pools.\"a.b\".targets[2].addr"),
            vec![
                Seg::Key("pools".into()),
                Seg::Key("a.b".into()),
                Seg::Key("targets".into()),
                Seg::Index(2),
                Seg::Key("addr".into())
            ]
        );
    }
}
