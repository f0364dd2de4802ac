//! `HttpGet`: an HTTP GET answers with the expected status, optionally a health+json body
//! whose status becomes this check's.

use crate::{Check, CheckResult};
use bytes::Bytes;
use http::{Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::time::{Duration, Instant};
use vigil_core::report::MAX_REPORT_BYTES;
use vigil_core::{HEALTH_JSON, Status};

/// Default timeout for the whole exchange (connect, headers, body): 2 s. Long enough for
/// a loaded dependency's health endpoint, short enough to stay under a usual check
/// timeout so the output names the HTTP phase rather than a generic timeout.
pub const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(2);

/// What the check does with the response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Any 2xx passes.
    Success,
    /// Exactly this code passes.
    Status(StatusCode),
    /// The body is health+json, judged by vigil-core's judge.
    HealthJson,
}

/// GETs a URL (plain `http://`: vigil has no TLS stack) on a fresh connection each time,
/// so a dependency that stopped accepting is seen even if an old connection still
/// works. Observed value: response time in milliseconds.
///
/// ```
/// use vigil::builtin::HttpGet;
/// let plain = HttpGet::new("http://127.0.0.1:9000/ping").unwrap().expect_status(204);
/// let deep = HttpGet::new("http://127.0.0.1:9001/health").unwrap().health_json();
/// ```
#[derive(Clone, Debug)]
pub struct HttpGet {
    uri: Uri,
    expect: Expect,
    timeout: Duration,
    client: Client<HttpConnector, Empty<Bytes>>,
}

/// A URL the check cannot use.
#[derive(Debug, thiserror::Error)]
pub enum HttpGetError {
    /// Not a URI at all.
    #[error("invalid URL {url:?}: {source}")]
    Invalid {
        /// The URL given.
        url: String,
        /// Why it does not parse.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// Not `http://host...`.
    #[error("unsupported URL {0:?}: only http:// with a host is supported (no TLS)")]
    Unsupported(String),
}

impl HttpGet {
    /// GETs `url`; any 2xx passes. Fails on a URL that is not `http://host[:port]/...`.
    pub fn new(url: &str) -> Result<Self, HttpGetError> {
        let uri: Uri = url.parse().map_err(|source| HttpGetError::Invalid {
            url: url.to_string(),
            source,
        })?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(HttpGetError::Unsupported(url.to_string()));
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            // A fresh connection per check: see the type's docs.
            .pool_max_idle_per_host(0)
            .build(connector);
        Ok(HttpGet {
            uri,
            expect: Expect::Success,
            timeout: DEFAULT_HTTP_TIMEOUT,
            client,
        })
    }

    /// Passes on exactly this status code (and fails on any other). Panics on a number
    /// that is not an HTTP status code (100..=999).
    pub fn expect_status(mut self, code: u16) -> Self {
        let code = StatusCode::from_u16(code).unwrap_or_else(|_| {
            panic!("HttpGet::expect_status: {code} is not an HTTP status code")
        });
        self.expect = Expect::Status(code);
        self
    }

    /// Reads the body as health+json and reports its status, judged by vigil-core's one
    /// judge ([`vigil_core::judge`](mod@vigil_core::judge)) demanding a health answer
    /// (`Answers::HealthJson`): on 2xx the body's status (a dependency that says `warn`
    /// makes this check warn); any 4xx-5xx fails (a 503 saying `pass` too); a page that
    /// is not health+json fails, naming what is wrong; a status-only 2xx (empty or
    /// `text/plain`) passes, as it does for `vigil check`, the balancer and the
    /// controller.
    pub fn health_json(mut self) -> Self {
        self.expect = Expect::HealthJson;
        self
    }

    /// The whole exchange must finish within this. Defaults to 2 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The answer's status, `Content-Type` and body.
    async fn exchange(&self) -> Result<(StatusCode, Option<String>, Bytes), String> {
        let request = Request::get(self.uri.clone())
            .header(
                header::USER_AGENT,
                concat!("vigil/", env!("CARGO_PKG_VERSION")),
            )
            .header(
                header::ACCEPT,
                format!("{HEALTH_JSON}, application/json;q=0.9, */*;q=0.1"),
            )
            .body(Empty::new())
            .map_err(|e| format!("cannot build request: {e}"))?;
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("GET {}: {}", self.uri, error_chain(&e)))?;
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = Limited::new(response.into_body(), MAX_REPORT_BYTES)
            .collect()
            .await
            .map_err(|e| format!("GET {}: reading body: {e}", self.uri))?
            .to_bytes();
        Ok((status, content_type, body))
    }
}

/// An error and its sources on one line ("client error (Connect): connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

impl Check for HttpGet {
    async fn check(&self) -> CheckResult {
        let started = Instant::now();
        let result = tokio::time::timeout(self.timeout, self.exchange()).await;
        let ms = (started.elapsed().as_secs_f64() * 1000.0 * 100.0).round() / 100.0;
        let (code, content_type, body) = match result {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return CheckResult::fail(e).with_observed(ms, "ms"),
            Err(_) => {
                return CheckResult::fail(format!(
                    "GET {} timed out after {}",
                    self.uri,
                    humantime::format_duration(self.timeout)
                ))
                .with_observed(ms, "ms");
            }
        };
        let (status, output) = match self.expect {
            Expect::Success if code.is_success() => {
                (Status::Pass, format!("GET {}: {code} in {ms} ms", self.uri))
            }
            Expect::Success => (
                Status::Fail,
                format!("GET {}: {code} in {ms} ms, expected 2xx", self.uri),
            ),
            Expect::Status(want) if code == want => {
                (Status::Pass, format!("GET {}: {code} in {ms} ms", self.uri))
            }
            Expect::Status(want) => (
                Status::Fail,
                format!("GET {}: {code} in {ms} ms, expected {want}", self.uri),
            ),
            // vigil-core's one judge (its doc has the rule table), demanding a health
            // answer: the body's status on 2xx, fail on any 4xx-5xx (a 503 saying pass
            // too), and a body that is not health+json fails.
            Expect::HealthJson => {
                let j = vigil_core::judge(
                    vigil_core::Answers::HealthJson,
                    code.as_u16(),
                    content_type.as_deref(),
                    &body,
                );
                (
                    j.status,
                    format!("GET {}: {} in {ms} ms", self.uri, j.detail),
                )
            }
        };
        CheckResult::new(status)
            .with_observed(ms, "ms")
            .with_output(output)
    }
}
