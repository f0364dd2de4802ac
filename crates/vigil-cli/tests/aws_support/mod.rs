//! A local AWS for the Auto Scaling tests: moto in server mode (started per test on a
//! free port, killed at the end), Query API calls to set it up and read it back
//! (independent of the controller's client), and a fault proxy in front of it that
//! answers throttling or 5xx first, or holds an answer, over real HTTP.
//!
//! Instances live in a VPC of 127.X.0.0/16 (X random per test): their private
//! addresses are loopback ones, so a health URL built from `{private_ip}` is probed on
//! this machine, where the test starts a backend on each.
#![allow(dead_code)]

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The region every test uses.
pub const REGION: &str = "eu-west-1";

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `moto_server` on a free loopback port.
pub struct Moto {
    child: Child,
    pub addr: SocketAddr,
}

impl Moto {
    /// Starts moto (`moto_server`, else `python3 -m moto.server`) and waits until it
    /// answers; fails with what to install when it cannot.
    pub fn start() -> Moto {
        let port = free_port().to_string();
        let args = ["-H", "127.0.0.1", "-p", port.as_str()];
        let spawn = |program: &str, pre: &[&str]| {
            Command::new(program)
                .args(pre)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
        };
        let mut child = match spawn("moto_server", &[]) {
            Ok(c) => c,
            Err(_) => spawn("python3", &["-m", "moto.server"]).unwrap_or_else(|e| {
                panic!(
                    "moto is not installed (neither moto_server nor python3 -m moto.server runs: {e}): run scripts/install-test-deps.sh (pip install 'moto[server]')"
                )
            }),
        };
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let started = Instant::now();
        while TcpStream::connect(addr).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                panic!(
                    "moto did not start ({status}): {}\nIs moto installed? Run scripts/install-test-deps.sh (pip install 'moto[server]').",
                    err.trim()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "moto did not answer on {addr} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // moto's log goes nowhere (a full pipe must not block it).
        drop(child.stderr.take());
        Moto { child, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Kills moto now (an AWS that stops answering: connections refused).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// One Query API call to `endpoint` (moto routes on the service named in the
/// credential scope; it does not check signatures). Panics on an error answer.
pub async fn query(endpoint: &str, service: &str, action: &str, params: &[(&str, &str)]) -> String {
    let (status, text) = query_status(endpoint, service, action, params).await;
    assert!((200..300).contains(&status), "{action}: {status}: {text}");
    text
}

/// The same call; its status and body, whatever they are.
pub async fn query_status(
    endpoint: &str,
    service: &str,
    action: &str,
    params: &[(&str, &str)],
) -> (u16, String) {
    let version = if service == "ec2" {
        "2016-11-15"
    } else {
        "2011-01-01"
    };
    let mut body = format!("Action={action}&Version={version}");
    for (k, v) in params {
        body.push_str(&format!("&{}={}", encode(k), encode(v)));
    }
    let r = reqwest::Client::new()
        .post(format!("{endpoint}/"))
        .header("content-type", "application/x-www-form-urlencoded; charset=utf-8")
        .header(
            "authorization",
            format!("AWS4-HMAC-SHA256 Credential=SETUP/20260101/{REGION}/{service}/aws4_request, SignedHeaders=host, Signature=0"),
        )
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{action}: {e}"));
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

/// The texts of every `<tag>` element, in order (the tests' XML is AWS's, flat enough
/// for this).
pub fn texts(xml: &str, tag: &str) -> Vec<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    xml.split(&open)
        .skip(1)
        .filter_map(|rest| rest.split(&close).next().map(str::to_string))
        .collect()
}

/// A VPC of loopback addresses with one subnet per zone (`eu-west-1a`, `eu-west-1b`)
/// and a launch configuration, in one moto.
pub struct Aws {
    pub moto: Moto,
    subnets: HashMap<char, String>,
}

/// An instance as a test knows it.
#[derive(Clone, Debug)]
pub struct Instance {
    pub id: String,
    pub private_ip: String,
    pub zone: String,
}

impl Aws {
    pub async fn start() -> Aws {
        let moto = Moto::start();
        let url = moto.url();
        let x = 10 + (std::process::id() % 240);
        let vpc = query(
            &url,
            "ec2",
            "CreateVpc",
            &[("CidrBlock", &format!("127.{x}.0.0/16"))],
        )
        .await;
        let vpc = texts(&vpc, "vpcId").remove(0);
        let mut subnets = HashMap::new();
        for (i, zone) in ['a', 'b'].into_iter().enumerate() {
            let s = query(
                &url,
                "ec2",
                "CreateSubnet",
                &[
                    ("VpcId", &vpc),
                    ("CidrBlock", &format!("127.{x}.{}.0/24", i + 1)),
                    ("AvailabilityZone", &format!("{REGION}{zone}")),
                ],
            )
            .await;
            subnets.insert(zone, texts(&s, "subnetId").remove(0));
        }
        query(
            &url,
            "autoscaling",
            "CreateLaunchConfiguration",
            &[
                ("LaunchConfigurationName", "lc"),
                ("ImageId", "ami-12c6146b"),
                ("InstanceType", "t3.micro"),
            ],
        )
        .await;
        Aws { moto, subnets }
    }

    pub fn url(&self) -> String {
        self.moto.url()
    }

    /// A group of `size` instances in zone `zone` (`'a'` or `'b'`).
    pub async fn create_group(&self, name: &str, zone: char, size: usize) -> Vec<Instance> {
        let size = size.to_string();
        query(
            &self.url(),
            "autoscaling",
            "CreateAutoScalingGroup",
            &[
                ("AutoScalingGroupName", name),
                ("LaunchConfigurationName", "lc"),
                ("MinSize", "0"),
                ("MaxSize", "20"),
                ("DesiredCapacity", &size),
                ("VPCZoneIdentifier", &self.subnets[&zone]),
                ("HealthCheckGracePeriod", "0"),
            ],
        )
        .await;
        self.instances(name).await
    }

    /// The group's instance ids, as Auto Scaling lists them.
    pub async fn group_instance_ids(&self, group: &str) -> Vec<String> {
        let g = query(
            &self.url(),
            "autoscaling",
            "DescribeAutoScalingGroups",
            &[("AutoScalingGroupNames.member.1", group)],
        )
        .await;
        texts(&g, "InstanceId")
    }

    /// The group's instances with their addresses (from EC2).
    pub async fn instances(&self, group: &str) -> Vec<Instance> {
        let ids = self.group_instance_ids(group).await;
        let mut out = Vec::new();
        for id in ids {
            let d = query(
                &self.url(),
                "ec2",
                "DescribeInstances",
                &[("InstanceId.1", &id)],
            )
            .await;
            // The instance's own address is the last privateIpAddress (the network
            // interfaces' come first).
            let private_ip = texts(&d, "privateIpAddress").pop().unwrap();
            let zone = texts(&d, "availabilityZone").remove(0);
            out.push(Instance {
                id,
                private_ip,
                zone,
            });
        }
        out
    }

    /// `(lifecycle state, health status)` of an instance, by
    /// `DescribeAutoScalingInstances`; None when no group has it.
    pub async fn health(&self, id: &str) -> Option<(String, String)> {
        let d = query(
            &self.url(),
            "autoscaling",
            "DescribeAutoScalingInstances",
            &[("InstanceIds.member.1", id)],
        )
        .await;
        let lifecycle = texts(&d, "LifecycleState").pop()?;
        let health = texts(&d, "HealthStatus").pop()?;
        Some((lifecycle, health))
    }

    /// Tags an instance (EC2 `CreateTags`).
    pub async fn tag(&self, id: &str, key: &str, value: &str) {
        query(
            &self.url(),
            "ec2",
            "CreateTags",
            &[
                ("ResourceId.1", id),
                ("Tag.1.Key", key),
                ("Tag.1.Value", value),
            ],
        )
        .await;
    }

    /// Sets the group's desired capacity (moto launches or terminates at once).
    pub async fn set_desired(&self, group: &str, n: usize) {
        query(
            &self.url(),
            "autoscaling",
            "SetDesiredCapacity",
            &[
                ("AutoScalingGroupName", group),
                ("DesiredCapacity", &n.to_string()),
            ],
        )
        .await;
    }

    /// Detaches an instance from the group, decrementing its desired capacity (the
    /// instance keeps running, outside the group).
    pub async fn detach(&self, group: &str, id: &str) {
        query(
            &self.url(),
            "autoscaling",
            "DetachInstances",
            &[
                ("AutoScalingGroupName", group),
                ("InstanceIds.member.1", id),
                ("ShouldDecrementDesiredCapacity", "true"),
            ],
        )
        .await;
    }

    /// The group's desired capacity.
    pub async fn desired(&self, group: &str) -> u32 {
        let g = query(
            &self.url(),
            "autoscaling",
            "DescribeAutoScalingGroups",
            &[("AutoScalingGroupNames.member.1", group)],
        )
        .await;
        texts(&g, "DesiredCapacity")[0].parse().unwrap()
    }
}

/// A Throttling error answer, as Auto Scaling sends it.
pub const THROTTLING: (u16, &str) = (
    400,
    "<ErrorResponse xmlns=\"http://autoscaling.amazonaws.com/doc/2011-01-01/\"><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error><RequestId>proxy-throttled</RequestId></ErrorResponse>",
);
/// A 503 error answer.
pub const UNAVAILABLE: (u16, &str) = (
    503,
    "<ErrorResponse><Error><Type>Receiver</Type><Code>ServiceUnavailable</Code><Message>Service is unavailable</Message></Error><RequestId>proxy-503</RequestId></ErrorResponse>",
);

/// What the proxy did with one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub action: String,
    /// `forwarded`, `held` (forwarded, never answered) or `refused <status>`.
    pub outcome: String,
    /// The access key id in the request's signature.
    pub access_key: String,
}

#[derive(Default)]
struct ProxyState {
    seen: Vec<Seen>,
    refuse_next: HashMap<String, VecDeque<(u16, String)>>,
    refuse_all: HashMap<String, (u16, String)>,
    hold: BTreeSet<String>,
    held: Vec<TcpStream>,
}

/// A loopback HTTP proxy in front of moto that can answer errors itself first.
pub struct FaultProxy {
    pub addr: SocketAddr,
    state: Arc<Mutex<ProxyState>>,
}

fn read_request(stream: &mut TcpStream) -> Option<(Vec<String>, Vec<u8>)> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let l = line.trim_end().to_string();
        if l.is_empty() {
            break;
        }
        lines.push(l);
    }
    let len: usize = lines
        .iter()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    Some((lines, body))
}

impl FaultProxy {
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let st = state.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let st = st.clone();
                std::thread::spawn(move || serve(stream, upstream, st));
            }
        });
        FaultProxy { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next `n` requests for `action` get `answer` instead of moto's.
    pub fn refuse_next(&self, action: &str, n: usize, answer: (u16, &str)) {
        let mut s = self.state.lock().unwrap();
        let q = s.refuse_next.entry(action.to_string()).or_default();
        for _ in 0..n {
            q.push_back((answer.0, answer.1.to_string()));
        }
    }

    /// Every request for `action` gets `answer` (None: moto's again).
    pub fn refuse_all(&self, action: &str, answer: Option<(u16, &str)>) {
        let mut s = self.state.lock().unwrap();
        match answer {
            Some((code, body)) => {
                s.refuse_all
                    .insert(action.to_string(), (code, body.to_string()));
            }
            None => {
                s.refuse_all.remove(action);
            }
        }
    }

    /// Requests for `action` are forwarded, and their answer never sent (true), or
    /// sent again (false).
    pub fn hold(&self, action: &str, on: bool) {
        let mut s = self.state.lock().unwrap();
        if on {
            s.hold.insert(action.to_string());
        } else {
            s.hold.remove(action);
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// Requests for `action` whose outcome starts with `outcome`.
    pub fn count(&self, action: &str, outcome: &str) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.action == action && s.outcome.starts_with(outcome))
            .count()
    }
}

fn serve(mut client: TcpStream, upstream: SocketAddr, state: Arc<Mutex<ProxyState>>) {
    let Some((lines, body)) = read_request(&mut client) else {
        return;
    };
    let form = String::from_utf8_lossy(&body).into_owned();
    let action = form
        .split('&')
        .find_map(|kv| kv.strip_prefix("Action="))
        .unwrap_or("")
        .to_string();
    let access_key = lines
        .iter()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            if !k.eq_ignore_ascii_case("authorization") {
                return None;
            }
            let cred = v.split("Credential=").nth(1)?;
            cred.split('/').next().map(str::to_string)
        })
        .unwrap_or_default();
    let (refusal, hold) = {
        let mut s = state.lock().unwrap();
        let refusal = s
            .refuse_next
            .get_mut(&action)
            .and_then(VecDeque::pop_front)
            .or_else(|| s.refuse_all.get(&action).cloned());
        (refusal, s.hold.contains(&action))
    };
    let record = |outcome: String| {
        state.lock().unwrap().seen.push(Seen {
            action: action.clone(),
            outcome,
            access_key: access_key.clone(),
        })
    };
    if let Some((code, text)) = refusal {
        record(format!("refused {code}"));
        let _ = client.write_all(
            format!(
                "HTTP/1.1 {code} Refused\r\ncontent-type: text/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                text.len()
            )
            .as_bytes(),
        );
        return;
    }
    let Ok(mut up) = TcpStream::connect(upstream) else {
        record("upstream down".into());
        return;
    };
    let mut head = String::new();
    for l in &lines {
        if l.to_ascii_lowercase().starts_with("connection:") {
            continue;
        }
        head.push_str(l);
        head.push_str("\r\n");
    }
    head.push_str("connection: close\r\n\r\n");
    let _ = up.write_all(head.as_bytes());
    let _ = up.write_all(&body);
    let mut answer = Vec::new();
    let _ = up.read_to_end(&mut answer);
    if hold {
        record("held".into());
        // Never answered: kept open until the test ends.
        state.lock().unwrap().held.push(client);
        return;
    }
    record("forwarded".into());
    let _ = client.write_all(&answer);
}
