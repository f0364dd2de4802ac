//! Targets from Auto Scaling groups (`[discovery.aws]`).
//!
//! Every `poll`: `DescribeAutoScalingGroups` for the configured groups, then EC2
//! `DescribeInstances` for their `InService` instances. Each becomes a target: id =
//! instance id, zone = its availability zone, group = the group's name, URL = the
//! `url` template filled from the instance's fields and tags.
//!
//! - Only `InService` instances are judged: `Pending*` ones are still in the group's
//!   own grace (they join once in service), `Terminating*`/`Terminated`, `Standby`,
//!   `Detaching` and warm-pool ones are leaving or not serving, and are forgotten.
//! - An instance whose URL cannot be built (a tag or address it lacks, an `https://`
//!   URL) is left out, with a warning naming it: it cannot be probed.
//! - **A failing AWS API never forgets targets**: an error (after the client's own
//!   retries within `[aws] deadline`), a group AWS does not know (a typo, or a read
//!   that lags) or an answer that cannot be read keeps the last good list in force; the
//!   next poll comes after a backoff (`poll` doubled per failure in a row, up to 8 x
//!   `poll`). Until the first good list after a start, the targets the store knows keep
//!   their guard state, unprobed, as with a discovery file that cannot be read.

use crate::aws::client::{AwsFailure, Client, Retry, Service, child, child_text, list};
use crate::aws::config::{AwsDiscoveryConfig, Piece, parse_template};
use crate::config::{ControllerConfig, TargetConfig};
use crate::discovery::Skipped;
use crate::engine::{Command, Source};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use vigil_core::backoff::Backoff;

/// Group names per `DescribeAutoScalingGroups` request (the API's maximum).
const GROUPS_PER_CALL: usize = 100;
/// Instance ids per `DescribeInstances` request: 100 keeps each answer small (EC2
/// answers a page of at most 1,000 anyway).
const INSTANCES_PER_CALL: usize = 100;
/// After failures in a row, the poll interval doubles up to this many times (8 x).
const MAX_BACKOFF_DOUBLINGS: u32 = 3;
/// Share of a failing poll's backoff that is random: equal jitter, so that replicas
/// (and controllers of other fleets in one account) that failed on one throttled API
/// do not all poll again together; a poll still waits at least `poll`.
const BACKOFF_JITTER: f64 = vigil_core::backoff::EQUAL_JITTER;

/// The wait before the next poll after `failures` failures in a row (at least 1):
/// `poll` doubled per failure up to 8 x, equal jitter, `rand_unit` in `[0, 1)`.
fn failing_poll_wait(
    poll: std::time::Duration,
    failures: u32,
    rand_unit: f64,
) -> std::time::Duration {
    Backoff::new(poll, poll.saturating_mul(1 << MAX_BACKOFF_DOUBLINGS))
        .with_jitter(BACKOFF_JITTER)
        .next(failures, rand_unit)
}

/// An instance of a group, as far as the URL template can see it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Instance {
    /// Instance id.
    pub instance_id: String,
    /// Group name.
    pub group: String,
    /// Availability zone.
    pub zone: String,
    /// Private IPv4 address.
    pub private_ip: Option<String>,
    /// Public IPv4 address.
    pub public_ip: Option<String>,
    /// Private DNS name.
    pub private_dns: Option<String>,
    /// Public DNS name.
    pub public_dns: Option<String>,
    /// Tags.
    pub tags: BTreeMap<String, String>,
}

impl Instance {
    fn field(&self, name: &str) -> Option<&str> {
        match name {
            "instance_id" => Some(self.instance_id.as_str()),
            "group" => Some(self.group.as_str()),
            "zone" => Some(self.zone.as_str()),
            "private_ip" => self.private_ip.as_deref(),
            "public_ip" => self.public_ip.as_deref(),
            "private_dns" => self.private_dns.as_deref(),
            "public_dns" => self.public_dns.as_deref(),
            _ => None,
        }
        .filter(|v| !v.is_empty())
    }

    /// Fills a parsed template; the error names what the instance lacks.
    pub fn render(&self, template: &[Piece]) -> Result<String, String> {
        let mut out = String::new();
        for p in template {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Field(f) => {
                    out.push_str(self.field(f).ok_or_else(|| format!("it has no {f}"))?)
                }
                Piece::Tag(t) => out.push_str(
                    self.tags
                        .get(t)
                        .filter(|v| !v.is_empty())
                        .ok_or_else(|| format!("it has no tag {t:?}"))?,
                ),
            }
        }
        Ok(out)
    }
}

/// One listing: the targets, and the instances left out with why.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Listing {
    /// Targets, sorted by id.
    pub targets: Vec<TargetConfig>,
    /// `InService` instances that are not targets, and why.
    pub skipped: Vec<Skipped>,
}

/// Lists the groups' `InService` instances as targets. An error leaves nothing
/// half-listed: the caller keeps its last list.
pub async fn list_targets(client: &Client, cfg: &AwsDiscoveryConfig) -> Result<Listing, String> {
    let template = parse_template(&cfg.url).map_err(|e| format!("url {:?}: {e}", cfg.url))?;
    let mut retry = client.retry();
    let members = describe_groups(client, &cfg.groups, &mut retry).await?;
    let in_service: Vec<&(String, String, String)> = members
        .iter()
        .filter(|(_, _, lifecycle)| lifecycle == "InService")
        .collect();
    let mut details: BTreeMap<String, Instance> = BTreeMap::new();
    for chunk in in_service.chunks(INSTANCES_PER_CALL) {
        let ids: Vec<&str> = chunk.iter().map(|(id, _, _)| id.as_str()).collect();
        for i in describe_instances(client, &ids, &mut retry).await? {
            details.insert(i.instance_id.clone(), i);
        }
    }
    let mut listing = Listing::default();
    for (id, group, _) in in_service {
        let Some(found) = details.get(id) else {
            // Listed by the group but not (yet) by EC2: its read lags; next poll.
            listing.skipped.push(Skipped {
                instance: id.clone(),
                group: group.clone(),
                why: "not in EC2's answer yet".into(),
            });
            continue;
        };
        let zone = found.zone.clone();
        let instance = Instance {
            group: group.clone(),
            ..found.clone()
        };
        let url = match instance.render(&template) {
            Ok(u) => u,
            Err(why) => {
                listing.skipped.push(Skipped {
                    instance: id.clone(),
                    group: group.clone(),
                    why: format!("url {:?} cannot be built: {why}", cfg.url),
                });
                continue;
            }
        };
        let target = TargetConfig {
            id: id.clone(),
            url,
            zone,
            group: group.clone(),
            heartbeat: false,
            interval: None,
        };
        if let Err(e) = target.validate("target") {
            listing.skipped.push(Skipped {
                instance: id.clone(),
                group: group.clone(),
                why: e.message,
            });
            continue;
        }
        listing.targets.push(target);
    }
    listing.targets.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(listing)
}

fn failed(call: &str, f: AwsFailure) -> String {
    format!("{call}: {f}")
}

/// `(instance id, group, lifecycle state)` of every instance of these groups; an error
/// if a group is not found.
async fn describe_groups(
    client: &Client,
    groups: &[String],
    retry: &mut Retry,
) -> Result<Vec<(String, String, String)>, String> {
    let mut members = Vec::new();
    let mut found = std::collections::BTreeSet::new();
    for chunk in groups.chunks(GROUPS_PER_CALL) {
        let mut token: Option<String> = None;
        loop {
            let mut params: Vec<(String, String)> = chunk
                .iter()
                .enumerate()
                .map(|(i, g)| (format!("AutoScalingGroupNames.member.{}", i + 1), g.clone()))
                .collect();
            params.push(("MaxRecords".into(), "100".into()));
            if let Some(t) = &token {
                params.push(("NextToken".into(), t.clone()));
            }
            let a = client
                .call(
                    Service::AutoScaling,
                    "DescribeAutoScalingGroups",
                    &params,
                    retry,
                )
                .await
                .map_err(|f| failed("DescribeAutoScalingGroups", f))?;
            let doc = a
                .doc()
                .map_err(|e| format!("DescribeAutoScalingGroups: {e}"))?;
            let result = doc
                .descendants()
                .find(|n| n.has_tag_name("DescribeAutoScalingGroupsResult"))
                .ok_or(
                    "DescribeAutoScalingGroups: no DescribeAutoScalingGroupsResult in the answer",
                )?;
            for g in list(result, "AutoScalingGroups") {
                let name = child_text(g, "AutoScalingGroupName")
                    .unwrap_or("")
                    .to_string();
                for m in list(g, "Instances") {
                    members.push((
                        child_text(m, "InstanceId").unwrap_or("").to_string(),
                        name.clone(),
                        child_text(m, "LifecycleState").unwrap_or("").to_string(),
                    ));
                }
                found.insert(name);
            }
            token = child_text(result, "NextToken")
                .filter(|t| !t.is_empty())
                .map(str::to_string);
            if token.is_none() {
                break;
            }
        }
    }
    if let Some(missing) = groups.iter().find(|g| !found.contains(*g)) {
        return Err(format!(
            "Auto Scaling group {missing:?} not found in region {}",
            client.region()
        ));
    }
    members.retain(|(id, _, _)| !id.is_empty());
    Ok(members)
}

/// EC2's view of these instances (addresses, zone, tags).
async fn describe_instances(
    client: &Client,
    ids: &[&str],
    retry: &mut Retry,
) -> Result<Vec<Instance>, String> {
    let params: Vec<(String, String)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| (format!("InstanceId.{}", i + 1), id.to_string()))
        .collect();
    let a = client
        .call(Service::Ec2, "DescribeInstances", &params, retry)
        .await
        .map_err(|f| failed("DescribeInstances", f))?;
    let doc = a.doc().map_err(|e| format!("DescribeInstances: {e}"))?;
    let root = doc.root_element();
    let mut out = Vec::new();
    for reservation in list(root, "reservationSet") {
        for i in list(reservation, "instancesSet") {
            let text = |name: &str| child_text(i, name).map(str::to_string);
            out.push(Instance {
                instance_id: text("instanceId").unwrap_or_default(),
                group: String::new(),
                zone: child(i, "placement")
                    .and_then(|p| child_text(p, "availabilityZone"))
                    .unwrap_or("")
                    .to_string(),
                private_ip: text("privateIpAddress"),
                public_ip: text("ipAddress"),
                private_dns: text("privateDnsName"),
                public_dns: text("dnsName"),
                tags: list(i, "tagSet")
                    .filter_map(|t| {
                        Some((
                            child_text(t, "key")?.to_string(),
                            child_text(t, "value").unwrap_or("").to_string(),
                        ))
                    })
                    .collect(),
            });
        }
    }
    Ok(out)
}

/// Polls the groups while `[discovery.aws]` is configured and sends each changed list
/// to the engine (as [`Source::Aws`]); errors keep the last list.
pub async fn run(
    mut config: watch::Receiver<Arc<ControllerConfig>>,
    engine: mpsc::Sender<Command>,
    status: Arc<crate::discovery::DiscoveryStatus>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut last: Option<Vec<TargetConfig>> = None;
    let mut last_skipped: Vec<Skipped> = Vec::new();
    let mut failures: u32 = 0;
    let mut client: Option<(crate::aws::config::AwsConfig, Client)> = None;
    loop {
        let cfg = config.borrow_and_update().clone();
        let wait = match cfg.discovery.as_ref().and_then(|d| d.aws.as_ref()) {
            None => None,
            Some(d) => {
                if client.as_ref().is_none_or(|(c, _)| *c != cfg.aws) {
                    client = match Client::new(&cfg.aws) {
                        Ok(c) => Some((cfg.aws.clone(), c)),
                        Err(e) => {
                            tracing::error!(error = %e, "Auto Scaling discovery cannot start; keeping the last list");
                            None
                        }
                    };
                }
                // A listing retried against a failing API can take `[aws] deadline`:
                // a shutdown does not wait for it.
                let outcome = match &client {
                    Some((_, c)) => tokio::select! {
                        biased;
                        _ = shutdown.changed() => return,
                        r = list_targets(c, d) => r,
                    },
                    None => Err("no AWS client".to_string()),
                };
                match outcome {
                    Ok(listing) => {
                        if failures > 0 {
                            tracing::info!(failures, "Auto Scaling discovery works again");
                        }
                        failures = 0;
                        status.succeeded_skipping(
                            Source::Aws,
                            listing.targets.len(),
                            listing.skipped.clone(),
                        );
                        if listing.skipped != last_skipped {
                            for s in &listing.skipped {
                                tracing::warn!(instance = %s.instance, group = %s.group, why = %s.why, "instance in service but not a target");
                            }
                            last_skipped = listing.skipped;
                        }
                        if last.as_ref() != Some(&listing.targets) {
                            tracing::info!(
                                groups = ?d.groups,
                                targets = listing.targets.len(),
                                "Auto Scaling groups listed; targets changed"
                            );
                            last = Some(listing.targets.clone());
                            if engine
                                .send(Command::Targets {
                                    source: Source::Aws,
                                    targets: listing.targets,
                                })
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                        Some(d.poll)
                    }
                    Err(e) => {
                        let kept = last.as_ref().map_or(0, Vec::len);
                        failures = status.failed(Source::Aws, &e);
                        tracing::error!(error = %e, failures, kept, "Auto Scaling discovery failed; keeping the last list");
                        Some(failing_poll_wait(d.poll, failures, rand::random()))
                    }
                }
            }
        };
        tokio::select! {
            biased;
            _ = shutdown.changed() => return,
            _ = config.changed() => {}
            _ = async {
                match wait {
                    Some(w) => tokio::time::sleep(w).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_poll_backs_off_doubling_up_to_8_polls_with_equal_jitter() {
        let poll = std::time::Duration::from_secs(30);
        let no_jitter: Vec<u64> = (1..6)
            .map(|f| failing_poll_wait(poll, f, 0.0).as_secs())
            .collect();
        assert_eq!(no_jitter, [60, 120, 240, 240, 240], "as before jitter");
        assert_eq!(
            failing_poll_wait(poll, 1, 0.999_999_999).as_secs(),
            30,
            "never sooner than one poll"
        );
    }

    #[test]
    fn urls_come_from_fields_and_tags_and_name_what_is_missing() {
        let i = Instance {
            instance_id: "i-1".into(),
            group: "web".into(),
            zone: "eu-west-1a".into(),
            private_ip: Some("10.0.0.7".into()),
            tags: [("vigil:health-url".to_string(), "http://h:9/".to_string())].into(),
            ..Instance::default()
        };
        let t = |s: &str| i.render(&parse_template(s).unwrap());
        assert_eq!(
            t("http://{private_ip}:8081").unwrap(),
            "http://10.0.0.7:8081"
        );
        assert_eq!(t("{tag:vigil:health-url}").unwrap(), "http://h:9/");
        assert_eq!(
            t("http://{instance_id}.{zone}.{group}").unwrap(),
            "http://i-1.eu-west-1a.web"
        );
        assert_eq!(t("http://{public_ip}").unwrap_err(), "it has no public_ip");
        assert_eq!(t("{tag:port}").unwrap_err(), "it has no tag \"port\"");
    }
}
