//! A client of AWS's Query APIs (Auto Scaling, EC2): a form-encoded `POST`, signed
//! with SigV4 (`aws-sigv4`), sent with reqwest (rustls), answered in XML (roxmltree).
//!
//! Retries ([`Client::call`], [`Retry`]): throttling error codes, 429, 5xx, timeouts
//! and connection errors are retried with exponential backoff and full jitter (a random
//! wait between 0 and the backoff, doubling from `[aws] backoff` up to
//! [`MAX_BACKOFF`]) until `[aws] deadline`; any other 4xx is final and carries AWS's
//! code, message and request id.

use crate::aws::config::AwsConfig;
use crate::aws::credentials::{self, Credentials};
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use std::time::{Duration, Instant, SystemTime};
use vigil_core::backoff::{Backoff, FULL_JITTER};

/// Longest backoff between two retries: 20 s, the AWS SDKs' standard-mode cap.
pub const MAX_BACKOFF: Duration = Duration::from_secs(20);
/// Bytes of a non-XML error answer kept in the error.
const BODY_KEEP: usize = 200;

/// Error codes that mean "slow down", retried like 5xx (the SDKs' throttling list,
/// plus Auto Scaling's `ResourceContention`).
const THROTTLING: [&str; 13] = [
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "RequestThrottled",
    "SlowDown",
    "PriorRequestNotComplete",
    "ResourceContention",
];

/// An AWS API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// Amazon EC2 Auto Scaling (`autoscaling`, API version 2011-01-01).
    AutoScaling,
    /// Amazon EC2 (`ec2`, API version 2016-11-15).
    Ec2,
}

impl Service {
    /// The name it is signed for (and its endpoint's first label).
    pub fn name(self) -> &'static str {
        match self {
            Service::AutoScaling => "autoscaling",
            Service::Ec2 => "ec2",
        }
    }

    fn version(self) -> &'static str {
        match self {
            Service::AutoScaling => "2011-01-01",
            Service::Ec2 => "2016-11-15",
        }
    }
}

/// Why a call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AwsError {
    /// AWS answered with an error document.
    #[error("{code}: {message} (HTTP {status}{})", request_id.as_ref().map(|r| format!(", request id {r}")).unwrap_or_default())]
    Api {
        /// HTTP status.
        status: u16,
        /// AWS's error code (`ValidationError`, `Throttling`, ...).
        code: String,
        /// AWS's message.
        message: String,
        /// The request id, to quote to AWS support.
        request_id: Option<String>,
    },
    /// An error answer that is not AWS's XML (a proxy's page, a gateway).
    #[error("HTTP {status}: {body}")]
    Http {
        /// HTTP status.
        status: u16,
        /// The start of its body.
        body: String,
    },
    /// No answer: connection refused or reset, timeout.
    #[error("request failed: {0}")]
    Transport(String),
    /// No credentials to sign with.
    #[error("{0}")]
    Credentials(String),
    /// A success answer that could not be read.
    #[error("unreadable answer: {0}")]
    Answer(String),
}

impl AwsError {
    /// Whether trying again may succeed: throttling, 429, 5xx, no answer.
    pub fn retryable(&self) -> bool {
        match self {
            AwsError::Api { status, code, .. } => {
                *status >= 500 || *status == 429 || THROTTLING.contains(&code.as_str())
            }
            AwsError::Http { status, .. } => *status >= 500 || *status == 429,
            AwsError::Transport(_) => true,
            AwsError::Credentials(_) | AwsError::Answer(_) => false,
        }
    }

    /// AWS's error code, if AWS gave one.
    pub fn code(&self) -> Option<&str> {
        match self {
            AwsError::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// A call that failed for good: the last error, and how many attempts it took.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{error}{}", if *.attempts > 1 { format!("; gave up after {} attempts", .attempts) } else if .error.retryable() { String::new() } else { "; not retried".to_string() })]
pub struct AwsFailure {
    /// The last error.
    pub error: AwsError,
    /// Attempts made.
    pub attempts: u32,
}

/// A success answer.
#[derive(Clone, Debug)]
pub struct AwsReply {
    /// The XML document.
    pub xml: String,
    /// AWS's request id (from the `x-amzn-requestid` header or the document).
    pub request_id: String,
    /// Attempts it took.
    pub attempts: u32,
}

impl AwsReply {
    /// The document, parsed.
    pub fn doc(&self) -> Result<roxmltree::Document<'_>, AwsError> {
        roxmltree::Document::parse(&self.xml).map_err(|e| AwsError::Answer(e.to_string()))
    }
}

/// Backoff with full jitter until a deadline, shared by every try of one piece of work.
#[derive(Debug)]
pub struct Retry {
    until: Instant,
    backoff: Backoff,
    /// Waits taken so far (the next one is `backoff`'s attempt this).
    waits: u32,
    /// Tries made so far.
    pub attempts: u32,
}

impl Retry {
    /// Retries until `deadline` from now, the first backoff `backoff`, doubling up to
    /// [`MAX_BACKOFF`], full jitter.
    pub fn new(deadline: Duration, backoff: Duration) -> Retry {
        Retry {
            until: Instant::now() + deadline,
            backoff: Backoff::new(backoff, MAX_BACKOFF).with_jitter(FULL_JITTER),
            waits: 0,
            attempts: 0,
        }
    }

    /// Time left before the deadline.
    pub fn left(&self) -> Duration {
        self.until.saturating_duration_since(Instant::now())
    }

    /// Sleeps a random time up to the current backoff, doubles it; false (without
    /// sleeping) when that sleep would reach the deadline.
    pub async fn wait(&mut self) -> bool {
        let sleep = self.backoff.next(self.waits, rand::random());
        if sleep >= self.left() {
            return false;
        }
        tokio::time::sleep(sleep).await;
        self.waits = self.waits.saturating_add(1);
        true
    }
}

/// A client of the Auto Scaling and EC2 APIs in one region.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    region: String,
    profile: Option<String>,
    autoscaling: String,
    ec2: String,
    timeout: Duration,
    deadline: Duration,
    backoff: Duration,
}

/// What SigV4's canonical form percent-encodes: every byte but the unreserved
/// characters of RFC 3986, `A-Z a-z 0-9 - _ . ~`.
const SIGV4_ENCODED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Percent-encodes a form value as SigV4's canonical form does (upper-case hex).
fn encode(s: &str) -> String {
    utf8_percent_encode(s, SIGV4_ENCODED).to_string()
}

/// The regional endpoint of a service (`.amazonaws.com.cn` in the China regions).
fn default_endpoint(service: Service, region: &str) -> String {
    let suffix = if region.starts_with("cn-") {
        "amazonaws.com.cn"
    } else {
        "amazonaws.com"
    };
    format!("https://{}.{region}.{suffix}/", service.name())
}

impl Client {
    /// A client for `[aws]`: the region (config, environment, profile) must be found.
    pub fn new(cfg: &AwsConfig) -> Result<Client, String> {
        let region = cfg
            .region
            .clone()
            .or_else(|| credentials::region_from_environment(cfg.profile.as_deref()))
            .ok_or("no AWS region: set [aws] region, AWS_REGION, or region in the profile")?;
        let endpoint = |specific: &Option<String>, service: Service| {
            let e = specific
                .clone()
                .or_else(|| cfg.endpoint.clone())
                .unwrap_or_else(|| default_endpoint(service, &region));
            if e.ends_with('/') { e } else { format!("{e}/") }
        };
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| format!("cannot build the AWS HTTP client: {e}"))?;
        Ok(Client {
            autoscaling: endpoint(&cfg.autoscaling_endpoint, Service::AutoScaling),
            ec2: endpoint(&cfg.ec2_endpoint, Service::Ec2),
            http,
            region,
            profile: cfg.profile.clone(),
            timeout: cfg.timeout,
            deadline: cfg.deadline,
            backoff: cfg.backoff,
        })
    }

    /// The region it calls.
    pub fn region(&self) -> &str {
        &self.region
    }

    /// A retry budget for one piece of work: `[aws] deadline` and `backoff`.
    pub fn retry(&self) -> Retry {
        Retry::new(self.deadline, self.backoff)
    }

    /// One call, retried while the error is retryable and `retry` has time left.
    pub async fn call(
        &self,
        service: Service,
        action: &str,
        params: &[(String, String)],
        retry: &mut Retry,
    ) -> Result<AwsReply, AwsFailure> {
        loop {
            retry.attempts += 1;
            match self.once(service, action, params, retry.left()).await {
                Ok(mut a) => {
                    a.attempts = retry.attempts;
                    return Ok(a);
                }
                Err(error) => {
                    if error.retryable() {
                        tracing::warn!(action, attempt = retry.attempts, error = %error, "AWS call failed; retrying");
                        if retry.wait().await {
                            continue;
                        }
                    }
                    return Err(AwsFailure {
                        error,
                        attempts: retry.attempts,
                    });
                }
            }
        }
    }

    /// One request, no retry; its timeout is `[aws] timeout` or `left`, the shorter.
    pub async fn once(
        &self,
        service: Service,
        action: &str,
        params: &[(String, String)],
        left: Duration,
    ) -> Result<AwsReply, AwsError> {
        let creds = credentials::resolve(self.profile.as_deref()).map_err(AwsError::Credentials)?;
        let url = match service {
            Service::AutoScaling => &self.autoscaling,
            Service::Ec2 => &self.ec2,
        };
        let mut body = format!("Action={}&Version={}", encode(action), service.version());
        for (k, v) in params {
            body.push('&');
            body.push_str(&encode(k));
            body.push('=');
            body.push_str(&encode(v));
        }
        let headers = self
            .signed_headers(service, url, &body, &creds)
            .map_err(AwsError::Credentials)?;
        let mut req = self
            .http
            .post(url)
            .timeout(self.timeout.min(left.max(Duration::from_millis(1))))
            .body(body);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| AwsError::Transport(error_chain(&e)))?;
        let status = resp.status().as_u16();
        let header_id = resp
            .headers()
            .get("x-amzn-requestid")
            .or_else(|| resp.headers().get("x-amz-request-id"))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let text = resp
            .text()
            .await
            .map_err(|e| AwsError::Transport(error_chain(&e)))?;
        if (200..300).contains(&status) {
            let doc = roxmltree::Document::parse(&text)
                .map_err(|e| AwsError::Answer(format!("{action}: {e}")))?;
            let request_id = header_id
                .or_else(|| find_text(doc.root(), &["RequestId", "requestId"]).map(str::to_string))
                .unwrap_or_default();
            drop(doc);
            return Ok(AwsReply {
                xml: text,
                request_id,
                attempts: 1,
            });
        }
        Err(error_answer(status, &text, header_id))
    }

    /// The headers that sign this request (`authorization`, `x-amz-date`, and
    /// `x-amz-security-token` for temporary credentials), with `host` and
    /// `content-type`, which are signed too.
    fn signed_headers(
        &self,
        service: Service,
        url: &str,
        body: &str,
        creds: &Credentials,
    ) -> Result<Vec<(String, String)>, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("endpoint {url:?}: {e}"))?;
        let host = uri
            .authority()
            .ok_or_else(|| format!("endpoint {url:?} has no host"))?
            .to_string();
        let content_type = "application/x-www-form-urlencoded; charset=utf-8";
        let identity = aws_credential_types::Credentials::new(
            &creds.access_key_id,
            &creds.secret_access_key,
            creds.session_token.clone(),
            None,
            "vigil",
        )
        .into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name(service.name())
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| format!("signing: {e}"))?
            .into();
        let signable = SignableRequest::new(
            "POST",
            url,
            [("host", host.as_str()), ("content-type", content_type)].into_iter(),
            SignableBody::Bytes(body.as_bytes()),
        )
        .map_err(|e| format!("signing: {e}"))?;
        let (instructions, _signature) = sign(signable, &params)
            .map_err(|e| format!("signing: {e}"))?
            .into_parts();
        let mut headers = vec![
            ("host".to_string(), host.clone()),
            ("content-type".to_string(), content_type.to_string()),
        ];
        let (signing, _query) = instructions.into_parts();
        headers.extend(
            signing
                .into_iter()
                .map(|h| (h.name().to_string(), h.value().to_string())),
        );
        Ok(headers)
    }
}

/// An error and its causes in one line (reqwest's own message alone says "error
/// sending request").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// Reads an error answer: Auto Scaling's `<ErrorResponse><Error><Code>` or EC2's
/// `<Response><Errors><Error><Code>`; anything else is kept as text.
fn error_answer(status: u16, text: &str, header_id: Option<String>) -> AwsError {
    if let Ok(doc) = roxmltree::Document::parse(text)
        && let Some(error) = doc.descendants().find(|n| n.has_tag_name("Error"))
        && let Some(code) = child_text(error, "Code")
    {
        return AwsError::Api {
            status,
            code: code.to_string(),
            message: child_text(error, "Message").unwrap_or("").to_string(),
            request_id: header_id
                .or_else(|| find_text(doc.root(), &["RequestId", "RequestID"]).map(str::to_string)),
        };
    }
    let body: String = text.trim().chars().take(BODY_KEEP).collect();
    AwsError::Http { status, body }
}

/// The first child element named `name` (local name: the namespaces are AWS's).
pub fn child<'a, 'i>(node: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    node.children()
        .find(|c| c.is_element() && c.tag_name().name() == name)
}

/// The text of the first child element named `name`.
pub fn child_text<'a>(node: roxmltree::Node<'a, '_>, name: &str) -> Option<&'a str> {
    child(node, name).and_then(|c| c.text())
}

/// The child elements of `node`'s child `list` (`member` or `item` entries).
pub fn list<'a, 'i>(
    node: roxmltree::Node<'a, 'i>,
    list: &str,
) -> impl Iterator<Item = roxmltree::Node<'a, 'i>> {
    child(node, list)
        .into_iter()
        .flat_map(|l| l.children().filter(|c| c.is_element()))
}

/// The text of the first element anywhere below `node` with one of these names.
fn find_text<'a>(node: roxmltree::Node<'a, '_>, names: &[&str]) -> Option<&'a str> {
    node.descendants()
        .find(|n| n.is_element() && names.contains(&n.tag_name().name()))
        .and_then(|n| n.text())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_values_are_percent_encoded_as_sigv4_wants() {
        assert_eq!(encode("a b/c~d_e.f-g"), "a%20b%2Fc~d_e.f-g");
        assert_eq!(encode("é"), "%C3%A9");
        // Pinned to the hand-written encoder's output: `%` itself, `+` (never a space
        // in SigV4), `=` and `&` of the form, upper-case hex.
        assert_eq!(
            encode("100% a+b=c&d/é~"),
            "100%25%20a%2Bb%3Dc%26d%2F%C3%A9~"
        );
    }

    #[test]
    fn endpoints_follow_the_region() {
        assert_eq!(
            default_endpoint(Service::AutoScaling, "eu-west-1"),
            "https://autoscaling.eu-west-1.amazonaws.com/"
        );
        assert_eq!(
            default_endpoint(Service::Ec2, "cn-north-1"),
            "https://ec2.cn-north-1.amazonaws.com.cn/"
        );
    }

    #[test]
    fn error_answers_of_both_apis_are_read() {
        let asg = r#"<ErrorResponse xmlns="http://autoscaling.amazonaws.com/doc/2011-01-01/"><Error><Type>Sender</Type><Code>ValidationError</Code><Message>Instance Id not found</Message></Error><RequestId>r-1</RequestId></ErrorResponse>"#;
        let e = error_answer(400, asg, None);
        assert_eq!(
            e,
            AwsError::Api {
                status: 400,
                code: "ValidationError".into(),
                message: "Instance Id not found".into(),
                request_id: Some("r-1".into())
            }
        );
        assert!(!e.retryable());
        let ec2 = r#"<?xml version="1.0"?><Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>slow</Message></Error></Errors><RequestID>r-2</RequestID></Response>"#;
        let e = error_answer(503, ec2, Some("hdr".into()));
        assert_eq!(e.code(), Some("RequestLimitExceeded"));
        assert!(e.retryable());
        assert!(e.to_string().contains("request id hdr"), "{e}");
        let throttled = error_answer(
            400,
            "<ErrorResponse><Error><Code>Throttling</Code><Message>Rate exceeded</Message></Error></ErrorResponse>",
            None,
        );
        assert!(throttled.retryable(), "throttling is retried even as a 400");
        let page = error_answer(502, "<html>bad gateway</html>", None);
        assert!(matches!(page, AwsError::Http { status: 502, .. }) && page.retryable());
    }

    #[test]
    fn a_failure_says_whether_it_was_retried() {
        let final_error = AwsFailure {
            error: AwsError::Api {
                status: 400,
                code: "ValidationError".into(),
                message: "m".into(),
                request_id: None,
            },
            attempts: 1,
        };
        assert_eq!(
            final_error.to_string(),
            "ValidationError: m (HTTP 400); not retried"
        );
        let retried = AwsFailure {
            error: AwsError::Transport("refused".into()),
            attempts: 4,
        };
        assert_eq!(
            retried.to_string(),
            "request failed: refused; gave up after 4 attempts"
        );
    }

    #[tokio::test]
    async fn retries_stop_at_the_deadline() {
        let started = Instant::now();
        let mut r = Retry::new(Duration::from_millis(300), Duration::from_millis(50));
        let mut waits = 0;
        while r.wait().await {
            waits += 1;
        }
        assert!(waits >= 1, "at least one retry fits in 300 ms");
        assert!(
            started.elapsed() < Duration::from_millis(300),
            "no sleep goes past the deadline"
        );
    }
}
