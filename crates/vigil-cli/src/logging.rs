//! Logging set-up shared by every subcommand: text or JSON lines on stderr, RFC 3339 UTC
//! timestamps, filtered by `RUST_LOG` (default `info`).

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// How log lines look.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber. Call once, first thing.
///
/// Colours only on a terminal (and not with `NO_COLOR` set): journald, a log file or a
/// pipe get plain text. JSON lines never have colour codes.
///
/// A log line that cannot be written is dropped: `vigil demo 2>&1 | tee log`, Ctrl-C,
/// and `tee` is gone before the last lines. The subscriber's default reports the failed
/// write with `eprintln!`, to the same closed stderr, which panics (exit 101).
///
/// Event fields must not be named `target` (nor `level`, `timestamp`): the JSON format
/// puts fields beside its own `target` (the module path), and a duplicate key makes
/// parsers keep one and lose the other. Name them `target_id`, `addr`, ...
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour && format == LogFormat::Text)
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
