//! Access logs: one JSON line per client request, written off the data path.
//!
//! Floor 7, shared (floors: the crate doc): imports no other module of this crate (the
//! daemon starts it from `[access_log]`, with its two counters).
//!
//! ## Design constraints
//!
//! - **Off the data path.** A request hands its [`Entry`] (a few owned fields, no
//!   formatting) to a bounded channel with `try_send` and goes on; one writer thread
//!   formats and writes. A request never waits for the log: when the channel is full
//!   (the disk is slower than the traffic), the line is dropped and counted in
//!   `vigil_lb_access_log_dropped_total` (vector's `WhenFull::DropNewest`).
//! - **Off means off.** With `enabled = false` (the default) there is no thread and no
//!   channel; the data path tests one `Option` per request and takes no clock reading.
//! - **A full or read-only disk does not stop proxying.** A line that cannot be written
//!   is counted in `vigil_lb_access_log_write_errors_total`; the first failure is logged
//!   (once per writer, with the file and the error), and a file that could not be
//!   opened is tried again at most once a second.
//! - **logrotate.** Each configuration (start, and every SIGHUP reload) has its own
//!   writer, which opens the file anew (`O_APPEND`); the previous writer writes what it
//!   still has and ends when the last request of the old configuration is done. So
//!   `logrotate` with `postrotate kill -HUP` works without `copytruncate`.
//!
//! ## Format
//!
//! One JSON object per line (JSON Lines), keys always present, in this order:
//! `time` (RFC 3339, UTC, milliseconds: when the answer was done), `client`
//! (`ip:port`), `proto` (`HTTP/1.1`, `HTTP/1.0`, `HTTP/2`), `method`, `path` (the path
//! only: a query string may hold secrets, and is logged only with `query = true`),
//! `status` (what the client got), `pool` (or `null`: no route), `target` (the
//! `host:port` whose answer was forwarded, or `null` when vigil answered itself),
//! `attempts` (targets tried, retries and hedges included), `bytes_in` (request body,
//! when its length was known), `bytes_out` (response body bytes written to the client),
//! `duration_ms` (from the request head to the end of the answer), `upstream_ms` (from
//! the start of the winning attempt to the target's response head, or `null`), `error`
//! (why vigil answered itself, or `null`).

use prometheus_client::metrics::counter::Counter;
use serde::Serialize;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime};

/// The lines one write gathers at most, when the channel holds that many.
const MAX_BATCH_BYTES: usize = 64 * 1024;
/// How often a file that cannot be opened is tried again.
const REOPEN_EVERY: Duration = Duration::from_secs(1);

/// One request, as the data path knows it. Formatting is the writer's work.
#[derive(Debug, Clone)]
pub struct Entry {
    /// When the answer was done.
    pub time: SystemTime,
    /// The client's address.
    pub client: SocketAddr,
    /// `HTTP/1.1`, `HTTP/1.0`, `HTTP/2`.
    pub proto: &'static str,
    /// Request method.
    pub method: String,
    /// The path (and query, when configured), as forwarded.
    pub path: String,
    /// The status the client got.
    pub status: u16,
    /// The pool, when a route matched.
    pub pool: Option<String>,
    /// The target whose answer was forwarded.
    pub target: Option<String>,
    /// Targets tried, retries and hedges included.
    pub attempts: u32,
    /// Request body bytes, when known.
    pub bytes_in: Option<u64>,
    /// Response body bytes written to the client.
    pub bytes_out: u64,
    /// From the request head to the end of the answer.
    pub duration: Duration,
    /// From the winning attempt's start to its response head.
    pub upstream: Option<Duration>,
    /// Why vigil answered itself.
    pub error: Option<String>,
}

impl Default for Entry {
    fn default() -> Self {
        Entry {
            time: SystemTime::UNIX_EPOCH,
            client: SocketAddr::from(([0, 0, 0, 0], 0)),
            proto: "",
            method: String::new(),
            path: String::new(),
            status: 0,
            pool: None,
            target: None,
            attempts: 0,
            bytes_in: None,
            bytes_out: 0,
            duration: Duration::ZERO,
            upstream: None,
            error: None,
        }
    }
}

/// One configuration's access log: the sending side of its writer's channel. Cheap to
/// clone; the writer ends when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct AccessLog {
    tx: SyncSender<Entry>,
    query: bool,
    dropped: Counter,
}

impl AccessLog {
    /// Starts a writer to `path` (`-`: standard output) with a channel of `buffer`
    /// lines; `query`: whether query strings are logged. `dropped` and `errors` count
    /// the lines dropped (channel full) and not written.
    pub fn start(
        path: &Path,
        query: bool,
        buffer: usize,
        dropped: Counter,
        errors: Counter,
    ) -> std::io::Result<AccessLog> {
        let (tx, rx) = std::sync::mpsc::sync_channel(buffer.max(1));
        let sink = if path == Path::new("-") {
            Sink::Stdout
        } else {
            Sink::File(path.to_path_buf())
        };
        std::thread::Builder::new()
            .name("vigil-access-log".into())
            .spawn(move || write_loop(rx, sink, errors))?;
        Ok(AccessLog { tx, query, dropped })
    }

    /// Hands `entry` to the writer without waiting; a full channel drops it (counted).
    pub fn send(&self, entry: Entry) {
        match self.tx.try_send(entry) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.inc();
            }
        }
    }

    /// The method and the path to log of a request whose request line starts `head`
    /// (`GET /a?b HTTP/1.1...`): the path without its query unless `query = true`.
    pub fn request_line(&self, head: &[u8]) -> (String, String) {
        let line = head.split(|&b| b == b'\r').next().unwrap_or(head);
        let mut parts = line.splitn(3, |&b| b == b' ');
        let method = parts.next().unwrap_or_default();
        let target = parts.next().unwrap_or_default();
        (
            String::from_utf8_lossy(method).into_owned(),
            self.path_of(&String::from_utf8_lossy(target)),
        )
    }

    /// What is logged of the request target `target`.
    pub fn path_of(&self, target: &str) -> String {
        if self.query {
            target.to_string()
        } else {
            target.split('?').next().unwrap_or_default().to_string()
        }
    }
}

/// A request being answered, logged when dropped (so a client that goes away in the
/// middle of its answer is logged too, with what was known).
#[derive(Debug)]
pub struct Pending {
    log: AccessLog,
    started: Instant,
    /// The line so far; `time` and `duration` are set when it is sent.
    pub entry: Entry,
}

impl Pending {
    /// Starts timing a request from `client`.
    pub fn begin(
        log: &AccessLog,
        client: SocketAddr,
        proto: &'static str,
        method: String,
        path: String,
    ) -> Pending {
        Pending {
            log: log.clone(),
            started: Instant::now(),
            entry: Entry {
                client,
                proto,
                method,
                path,
                ..Entry::default()
            },
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut entry = std::mem::take(&mut self.entry);
        entry.duration = self.started.elapsed();
        entry.time = SystemTime::now();
        self.log.send(entry);
    }
}

/// Where the lines go.
enum Sink {
    Stdout,
    File(PathBuf),
}

/// The JSON form of an [`Entry`] (the format in the module doc).
#[derive(Serialize)]
struct Line<'a> {
    time: String,
    client: SocketAddr,
    proto: &'a str,
    method: &'a str,
    path: &'a str,
    status: u16,
    pool: Option<&'a str>,
    target: Option<&'a str>,
    attempts: u32,
    bytes_in: Option<u64>,
    bytes_out: u64,
    duration_ms: f64,
    upstream_ms: Option<f64>,
    error: Option<&'a str>,
}

fn millis(d: Duration) -> f64 {
    // Microsecond precision is plenty, and keeps the lines short.
    d.as_micros() as f64 / 1000.0
}

/// Appends `e` as one JSON line to `out`.
pub fn format_line(out: &mut Vec<u8>, e: &Entry) {
    let line = Line {
        time: humantime::format_rfc3339_millis(e.time).to_string(),
        client: e.client,
        proto: e.proto,
        method: &e.method,
        path: &e.path,
        status: e.status,
        pool: e.pool.as_deref(),
        target: e.target.as_deref(),
        attempts: e.attempts,
        bytes_in: e.bytes_in,
        bytes_out: e.bytes_out,
        duration_ms: millis(e.duration),
        upstream_ms: e.upstream.map(millis),
        error: e.error.as_deref(),
    };
    // serde_json escapes control characters and quotes: a line is always one line.
    serde_json::to_writer(&mut *out, &line).expect("serialising to a Vec cannot fail");
    out.push(b'\n');
}

/// The writer thread: gathers what the channel holds, writes it in one go, until every
/// sender is gone.
fn write_loop(rx: Receiver<Entry>, sink: Sink, errors: Counter) {
    let mut out: Option<Box<dyn Write>> = None;
    let mut last_open: Option<Instant> = None;
    let mut reported = false;
    let mut buf = Vec::with_capacity(MAX_BATCH_BYTES);
    let mut report = |what: String| {
        if !reported {
            reported = true;
            tracing::error!(
                "access log: {what}; requests are still served, and lines not written are \
                 counted in vigil_lb_access_log_write_errors_total (logged once)"
            );
        }
    };
    while let Ok(first) = rx.recv() {
        buf.clear();
        let mut lines = 1u64;
        format_line(&mut buf, &first);
        while buf.len() < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(e) => {
                    format_line(&mut buf, &e);
                    lines += 1;
                }
                Err(_) => break,
            }
        }
        if out.is_none() && last_open.is_none_or(|t| t.elapsed() >= REOPEN_EVERY) {
            last_open = Some(Instant::now());
            out = match &sink {
                Sink::Stdout => Some(Box::new(std::io::stdout())),
                Sink::File(path) => match std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                {
                    Ok(f) => Some(Box::new(f)),
                    Err(e) => {
                        report(format!("cannot open {}: {e}", path.display()));
                        None
                    }
                },
            };
        }
        let Some(w) = out.as_mut() else {
            errors.inc_by(lines);
            continue;
        };
        // Whole lines in one write: an O_APPEND file (or a pipe, up to its buffer)
        // never interleaves them with another writer's.
        if let Err(e) = w.write_all(&buf).and_then(|()| w.flush()) {
            errors.inc_by(lines);
            let at = match &sink {
                Sink::Stdout => "stdout".to_string(),
                Sink::File(p) => p.display().to_string(),
            };
            report(format!("cannot write to {at}: {e}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str) -> Entry {
        Entry {
            time: SystemTime::UNIX_EPOCH + Duration::from_millis(1_500),
            client: "127.0.0.1:4000".parse().unwrap(),
            proto: "HTTP/1.1",
            method: "GET".into(),
            path: path.into(),
            status: 200,
            pool: Some("web".into()),
            target: Some("127.0.0.1:9000".into()),
            attempts: 2,
            bytes_in: None,
            bytes_out: 12,
            duration: Duration::from_micros(1_234),
            upstream: Some(Duration::from_micros(1_000)),
            error: None,
        }
    }

    #[test]
    fn a_line_is_one_json_object_with_every_key() {
        let mut out = Vec::new();
        format_line(&mut out, &entry("/a\"b\n\\c"));
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches('\n').count(), 1, "one line: {text}");
        assert!(text.ends_with('\n'));
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["time"], "1970-01-01T00:00:01.500Z");
        assert_eq!(v["path"], "/a\"b\n\\c", "the path survives escaping");
        assert_eq!(v["attempts"], 2);
        assert_eq!(v["duration_ms"], 1.234);
        assert_eq!(v["upstream_ms"], 1.0);
        assert_eq!(v["bytes_in"], serde_json::Value::Null);
        assert_eq!(v["error"], serde_json::Value::Null);
        assert_eq!(
            v.as_object().unwrap().len(),
            14,
            "every key, always: {text}"
        );
    }

    #[test]
    fn the_query_is_left_out_unless_asked_for() {
        let (tx, _rx) = std::sync::mpsc::sync_channel(1);
        let mut log = AccessLog {
            tx,
            query: false,
            dropped: Counter::default(),
        };
        let head = b"GET /login?token=secret HTTP/1.1\r\nhost: x\r\n";
        assert_eq!(log.request_line(head), ("GET".into(), "/login".into()));
        log.query = true;
        assert_eq!(log.request_line(head).1, "/login?token=secret");
    }

    #[test]
    fn a_full_channel_drops_and_counts_instead_of_waiting() {
        let dropped = Counter::default();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let log = AccessLog {
            tx,
            query: false,
            dropped: dropped.clone(),
        };
        log.send(entry("/1"));
        log.send(entry("/2"));
        log.send(entry("/3"));
        assert_eq!(dropped.get(), 2, "two lines past capacity 1");
        assert_eq!(rx.try_recv().unwrap().path, "/1");
    }
}
