//! The AWS parts of `fleet.toml`: `[aws]` (how AWS is reached, shared by the actuator
//! and discovery), `[actuator.aws]` and `[discovery.aws]`. Kept apart from
//! `config.rs`, which only holds them.

use serde::{Deserialize, Serialize};
use std::time::Duration;
use vigil_core::Invalid;

/// Default timeout of one AWS API request: 10 s. The Auto Scaling and EC2 APIs answer
/// in well under a second; a request still waiting after 10 s is retried rather than
/// waited on.
pub const DEFAULT_AWS_TIMEOUT: Duration = Duration::from_secs(10);
/// Default deadline of one AWS call with its retries (throttling, 5xx, connection
/// errors): 60 s. The AWS SDKs stop after 3 attempts; the controller acts rarely and
/// would rather ride out a minute of throttling than fail the action.
pub const DEFAULT_AWS_DEADLINE: Duration = Duration::from_secs(60);
/// Default first backoff between retries: 200 ms, doubled each retry up to 20 s (the
/// SDKs' standard retry mode uses a 20 s cap too), with full jitter (a random wait
/// between 0 and the backoff: AWS's advice against synchronised retries).
pub const DEFAULT_AWS_BACKOFF: Duration = Duration::from_millis(200);
/// Default: respect the instance's health-check grace period when marking it
/// Unhealthy (`ShouldRespectGracePeriod`), as AWS's own health checks do: an instance
/// still starting up is not replaced for failing.
pub const DEFAULT_RESPECT_GRACE_PERIOD: bool = true;
/// Default Auto Scaling discovery poll: 30 s. `DescribeAutoScalingGroups` and
/// `DescribeInstances` are rate-limited per account and shared with every other tool;
/// an instance joins a group over minutes, so 30 s costs nothing in reaction time.
pub const DEFAULT_AWS_DISCOVERY_POLL: Duration = Duration::from_secs(30);
/// Default health URL template: the instance's `vigil:health-url` tag, so each
/// instance (or its launch template) says where it answers; `http://{private_ip}:8081`
/// is the usual alternative.
pub const DEFAULT_AWS_URL_TEMPLATE: &str = "{tag:vigil:health-url}";

/// `[aws]`: where and as whom the controller calls AWS.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AwsConfig {
    /// Region, e.g. `eu-west-1`. Defaults to `AWS_REGION`, then `AWS_DEFAULT_REGION`,
    /// then the profile's `region` in the shared config file.
    pub region: Option<String>,
    /// Profile of the shared config and credentials files. Defaults to `AWS_PROFILE`,
    /// then `default`.
    pub profile: Option<String>,
    /// Endpoint of both APIs, e.g. `http://127.0.0.1:5000` for moto. Defaults to AWS's
    /// regional endpoints.
    pub endpoint: Option<String>,
    /// Endpoint of the Auto Scaling API (a VPC endpoint); wins over `endpoint`.
    pub autoscaling_endpoint: Option<String>,
    /// Endpoint of the EC2 API (a VPC endpoint); wins over `endpoint`.
    pub ec2_endpoint: Option<String>,
    /// Timeout of one request. Defaults to 10 s.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// How long one call may be retried (throttling, 5xx, connection errors). Defaults
    /// to 60 s.
    #[serde(with = "humantime_serde")]
    pub deadline: Duration,
    /// First backoff between retries, doubled up to 20 s, with full jitter. Defaults to
    /// 200 ms.
    #[serde(with = "humantime_serde")]
    pub backoff: Duration,
}

impl Default for AwsConfig {
    fn default() -> Self {
        AwsConfig {
            region: None,
            profile: None,
            endpoint: None,
            autoscaling_endpoint: None,
            ec2_endpoint: None,
            timeout: DEFAULT_AWS_TIMEOUT,
            deadline: DEFAULT_AWS_DEADLINE,
            backoff: DEFAULT_AWS_BACKOFF,
        }
    }
}

/// What the `aws-autoscaling` actuator asks of the Auto Scaling group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AwsActMode {
    /// `SetInstanceHealth` `Unhealthy`: the group terminates the instance and launches
    /// a replacement, by its own rules (lifecycle hooks, instance refresh, warm pools).
    #[default]
    SetUnhealthy,
    /// `TerminateInstanceInAutoScalingGroup` with `ShouldDecrementDesiredCapacity =
    /// false`: terminated now, replaced to keep the desired capacity.
    Terminate,
}

/// `[actuator.aws]`: the `aws-autoscaling` actuator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AwsActuatorConfig {
    /// `set-unhealthy` (default) or `terminate`.
    pub mode: AwsActMode,
    /// `ShouldRespectGracePeriod` of `SetInstanceHealth`. Defaults to true.
    pub respect_grace_period: bool,
}

impl Default for AwsActuatorConfig {
    fn default() -> Self {
        AwsActuatorConfig {
            mode: AwsActMode::default(),
            respect_grace_period: DEFAULT_RESPECT_GRACE_PERIOD,
        }
    }
}

/// `[discovery.aws]`: targets from Auto Scaling groups.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AwsDiscoveryConfig {
    /// Names of the Auto Scaling groups whose `InService` instances are targets.
    pub groups: Vec<String>,
    /// Health URL of an instance, a template over its fields (`{instance_id}`,
    /// `{private_ip}`, `{public_ip}`, `{private_dns}`, `{public_dns}`, `{zone}`,
    /// `{group}`) and tags (`{tag:NAME}`). Defaults to `{tag:vigil:health-url}`.
    pub url: String,
    /// How often the groups are listed. Defaults to 30 s.
    #[serde(with = "humantime_serde")]
    pub poll: Duration,
}

impl Default for AwsDiscoveryConfig {
    fn default() -> Self {
        AwsDiscoveryConfig {
            groups: Vec::new(),
            url: DEFAULT_AWS_URL_TEMPLATE.to_string(),
            poll: DEFAULT_AWS_DISCOVERY_POLL,
        }
    }
}

/// The fields a URL template may name (besides `tag:NAME`).
pub const TEMPLATE_FIELDS: [&str; 7] = [
    "instance_id",
    "private_ip",
    "public_ip",
    "private_dns",
    "public_dns",
    "zone",
    "group",
];

/// One piece of a parsed URL template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Text copied as is.
    Text(String),
    /// An instance field (one of [`TEMPLATE_FIELDS`]).
    Field(String),
    /// A tag's value.
    Tag(String),
}

/// Parses a URL template: `{field}`, `{tag:NAME}`, text; `{{` and `}}` are braces.
pub fn parse_template(template: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => name.push(c),
                        None => return Err(format!("unclosed `{{{name}`")),
                    }
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                if let Some(tag) = name.strip_prefix("tag:") {
                    if tag.is_empty() {
                        return Err("`{tag:}` names no tag".into());
                    }
                    pieces.push(Piece::Tag(tag.to_string()));
                } else if TEMPLATE_FIELDS.contains(&name.as_str()) {
                    pieces.push(Piece::Field(name));
                } else {
                    return Err(format!(
                        "unknown field `{{{name}}}` (known: {}, tag:NAME)",
                        TEMPLATE_FIELDS.join(", ")
                    ));
                }
            }
            '}' => return Err("a lone `}` (write `}}` for a brace)".into()),
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

impl AwsConfig {
    /// Checks the values; the error's key is relative to `[aws]`. `used`: whether the
    /// actuator or discovery calls AWS (then a region must be found).
    pub fn validate(&self, used: bool) -> Result<(), Invalid> {
        for (key, value) in [
            ("endpoint", &self.endpoint),
            ("autoscaling_endpoint", &self.autoscaling_endpoint),
            ("ec2_endpoint", &self.ec2_endpoint),
        ] {
            if let Some(v) = value {
                let ok = (v.starts_with("http://") || v.starts_with("https://"))
                    && v.parse::<http::Uri>().is_ok_and(|u| u.host().is_some());
                if !ok {
                    return Err(Invalid::new(
                        key,
                        format!("must be an http:// or https:// URL, got {v:?}"),
                    ));
                }
            }
        }
        if let Some(r) = &self.region
            && (r.is_empty()
                || !r
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'))
        {
            return Err(Invalid::new(
                "region",
                format!("must be a region name like \"eu-west-1\", got {r:?}"),
            ));
        }
        if self.timeout.is_zero() {
            return Err(Invalid::new("timeout", "must be longer than 0s"));
        }
        if self.deadline.is_zero() {
            return Err(Invalid::new("deadline", "must be longer than 0s"));
        }
        if self.backoff.is_zero() {
            return Err(Invalid::new("backoff", "must be longer than 0s"));
        }
        if used
            && self.region.is_none()
            && crate::aws::credentials::region_from_environment(self.profile.as_deref()).is_none()
        {
            return Err(Invalid::new(
                "region",
                "must be set: no AWS_REGION, AWS_DEFAULT_REGION or region in the profile of the shared config file",
            ));
        }
        Ok(())
    }
}

impl AwsDiscoveryConfig {
    /// Checks the values; the error's key is relative to `[discovery.aws]`.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.groups.is_empty() {
            return Err(Invalid::new("groups", "must name at least one group"));
        }
        if let Some(i) = self.groups.iter().position(|g| g.is_empty()) {
            return Err(Invalid::new(format!("groups[{i}]"), "must not be empty"));
        }
        if self.poll.is_zero() {
            return Err(Invalid::new("poll", "must be longer than 0s"));
        }
        parse_template(&self.url)
            .map_err(|e| Invalid::new("url", format!("{:?}: {e}", self.url)))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_fields_and_tags() {
        assert_eq!(
            parse_template("http://{private_ip}:8081").unwrap(),
            vec![
                Piece::Text("http://".into()),
                Piece::Field("private_ip".into()),
                Piece::Text(":8081".into())
            ]
        );
        assert_eq!(
            parse_template("{tag:vigil:health-url}").unwrap(),
            vec![Piece::Tag("vigil:health-url".into())]
        );
        assert_eq!(
            parse_template("{{x}}").unwrap(),
            vec![Piece::Text("{x}".into())]
        );
        assert!(
            parse_template("http://{privateip}")
                .unwrap_err()
                .contains("unknown field")
        );
        assert!(
            parse_template("http://{private_ip")
                .unwrap_err()
                .contains("unclosed")
        );
        assert!(parse_template("{tag:}").is_err());
        assert!(parse_template("a}b").is_err());
    }
}
