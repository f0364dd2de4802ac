use super::*;

const GOOD: &str = r#"
listen = "127.0.0.1:18080"
admin_listen = "127.0.0.1:19901"

[[routes]]
host = "api.example.com"
path_prefix = "/v1"
pool = "api"

[[routes]]
pool = "web"

[pools.api]
targets = [{ addr = "127.0.0.1:9001" }, { addr = "127.0.0.1:9002", weight = 2, zone = "b" }]

[pools.api.health_check]
interval = "500ms"
health_json = true

[pools.web]
balance = "round-robin"
targets = [{ addr = "localhost:9003" }]
"#;

fn p(text: &str) -> Result<LbConfig, ConfigError> {
    parse(Path::new("lb.toml"), text)
}

#[test]
fn every_field_has_a_default() {
    let c = p("").expect("an empty file is valid");
    assert_eq!(c, LbConfig::default());
}

#[test]
fn a_full_config_parses() {
    let c = p(GOOD).unwrap();
    assert_eq!(c.routes.len(), 2);
    let api = &c.pools["api"];
    assert_eq!(api.targets[1].weight, 2);
    assert_eq!(api.health_check.interval, Duration::from_millis(500));
    assert_eq!(api.health_check.path, "/readyz");
    assert_eq!(c.pools["web"].balance, Balance::RoundRobin);
}

#[test]
fn the_retry_throttle_is_on_by_default_a_table_or_off() {
    let on = |c: &LbConfig| c.pools["api"].retries.throttle;
    let c = p(GOOD).unwrap();
    assert_eq!(on(&c).tokens(), Some(RetryThrottleConfig::default()));
    let c = p(&format!(
        "{GOOD}\n[pools.api.retries.throttle]\nmax_tokens = 100\ntoken_ratio = 0.5\n"
    ))
    .unwrap();
    assert_eq!(
        on(&c).tokens(),
        Some(RetryThrottleConfig {
            max_tokens: 100,
            token_ratio: 0.5
        })
    );
    let c = p(&format!(
        "{GOOD}\n[pools.api.retries]\nthrottle = \"off\"\n"
    ))
    .unwrap();
    assert_eq!(on(&c), RetryThrottleSetting::Off);
    // Serialised back as written (the reference test walks the serialised form).
    let v = serde_json::to_value(&c).unwrap();
    assert_eq!(v["pools"]["api"]["retries"]["throttle"], "off");

    let e = p(&format!("{GOOD}\n[pools.api.retries]\nthrottle = \"no\"\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("pools.api.retries.throttle"), "{e}");
    assert!(e.contains("\"off\" or a table"), "{e}");
    let e = p(&format!(
        "{GOOD}\n[pools.api.retries.throttle]\nmax_tokens = 0\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("pools.api.retries.throttle.max_tokens"), "{e}");
    let e = p(&format!(
        "{GOOD}\n[pools.api.retries.throttle]\nmax_tokenz = 5\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("unknown field `max_tokenz`"), "{e}");
}

#[test]
fn per_try_is_derived_from_the_pools_retries_unless_set() {
    let t = TimeoutsConfig {
        response_header: Duration::from_secs(2),
        ..TimeoutsConfig::default()
    };
    assert_eq!(t.per_try_for(2), Duration::from_millis(666));
    assert_eq!(t.per_try_for(0), Duration::from_secs(2));
    let set = TimeoutsConfig {
        per_try: Some(Duration::from_millis(1500)),
        ..t
    };
    assert_eq!(set.per_try_for(2), Duration::from_millis(1500));
}

#[test]
fn local_shedding_is_off_unless_a_pool_asks_for_it() {
    assert_eq!(p(GOOD).unwrap().pools["api"].throttle, None);
    let c = p(&format!("{GOOD}\n[pools.api.throttle]\nk = 3.0\n")).unwrap();
    let t = c.pools["api"].throttle.unwrap();
    assert_eq!((t.k, t.window), (3.0, Duration::from_secs(120)));
    let e = p(&format!("{GOOD}\n[pools.api.throttle]\nk = 1.0\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("pools.api.throttle.k"), "{e}");
}

#[test]
fn a_clients_deadline_is_stripped_unless_trusted() {
    assert_eq!(p("").unwrap().headers.deadline, ClientDeadline::Strip);
    let c = p("[headers]\ndeadline = \"trust\"\n").unwrap();
    assert_eq!(c.headers.deadline, ClientDeadline::Trust);
    assert!(p("[headers]\ndeadline = true\n").is_err());
}

#[test]
fn the_example_config_is_valid() {
    let text = include_str!("../../../../examples/lb.toml");
    p(text).unwrap_or_else(|e| panic!("examples/lb.toml: {e}"));
}

#[test]
fn unknown_keys_are_rejected_with_line_and_key() {
    let text = GOOD.replace("interval = \"500ms\"", "intervall = \"500ms\"");
    let e = p(&text).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "lb.toml:17:1: key `pools.api.health_check.intervall`: unknown field `intervall`"
        ),
        "{e}"
    );
    assert!(e.contains("intervall = \"500ms\""), "shows the line: {e}");
}

#[test]
fn worker_slice_is_0_or_what_the_kernel_accepts() {
    let c = p("worker_slice = \"1ms\"").unwrap();
    assert_eq!(c.worker_slice, Duration::from_millis(1));
    assert_eq!(
        p("worker_slice = \"0s\"").unwrap().worker_slice,
        Duration::ZERO
    );
    for bad in ["50us", "101ms"] {
        let e = p(&format!("workers = 2\nworker_slice = \"{bad}\""))
            .unwrap_err()
            .to_string();
        assert!(
                e.starts_with("lb.toml:2:1: key `worker_slice`: must be 0s (the kernel's default) or from 100us to 100ms, got "),
                "{e}"
            );
    }
}

#[test]
fn wrong_types_name_the_key() {
    let text = GOOD.replace("interval = \"500ms\"", "interval = 5");
    let e = p(&text).unwrap_err().to_string();
    assert!(
        e.starts_with("lb.toml:17:12: key `pools.api.health_check.interval`"),
        "{e}"
    );
    let text = GOOD.replace("interval = \"500ms\"", "interval = \"5 parsecs\"");
    let e = p(&text).unwrap_err().to_string();
    assert!(e.contains("pools.api.health_check.interval"), "{e}");
}

#[test]
fn invalid_values_name_file_line_and_key() {
    let text = GOOD.replace("pool = \"web\"", "pool = \"nope\"");
    let e = p(&text).unwrap_err().to_string();
    assert!(
        e.starts_with("lb.toml:11:1: key `routes[1].pool`: no pool named \"nope\""),
        "{e}"
    );

    let text = GOOD.replace("addr = \"127.0.0.1:9002\"", "addr = \"127.0.0.1\"");
    let e = p(&text).unwrap_err().to_string();
    assert!(e.contains("key `pools.api.targets[1].addr`"), "{e}");
    assert!(e.starts_with("lb.toml:14:"), "{e}");

    let text = GOOD.replace(
        "health_json = true",
        "health_json = true\nunhealthy_threshold = 0",
    );
    let e = p(&text).unwrap_err().to_string();
    assert!(
        e.starts_with(
            "lb.toml:19:1: key `pools.api.health_check.unhealthy_threshold`: must be at least 1"
        ),
        "{e}"
    );

    let text = GOOD.replace("[pools.web]", "[pools.web]\npanic_threshold = 50");
    let e = p(&text).unwrap_err().to_string();
    assert!(
        e.contains("key `pools.web.panic_threshold`: must be a fraction"),
        "{e}"
    );

    let text = GOOD.replace(
        "[pools.web]",
        "[pools.web.outlier]\nmax_ejection_percent = 300\n[pools.web]",
    );
    let e = p(&text).unwrap_err().to_string();
    assert!(
        e.contains("key `pools.web.outlier.max_ejection_percent`"),
        "{e}"
    );

    let text = GOOD.replace(
        "[pools.web]",
        "[pools.web.outlier.success_rate]\nfloor = 1.5\n[pools.web]",
    );
    let e = p(&text).unwrap_err().to_string();
    assert!(
        e.contains("key `pools.web.outlier.success_rate.floor`: must be in (0, 1], got 1.5"),
        "{e}"
    );
    let text = GOOD.replace(
        "[pools.web]",
        "[pools.web.outlier.success_rate]\ninterval = \"20s\"\nwindow = \"10s\"\n[pools.web]",
    );
    let e = p(&text).unwrap_err().to_string();
    assert!(
        e.contains("key `pools.web.outlier.success_rate.window`: must be at least interval (20s)"),
        "{e}"
    );
}

#[test]
fn tls_listeners_need_an_address_certificates_and_known_protocols() {
    let ok = "[tls_listeners.public]\nlisten = \"127.0.0.1:8443\"\n\
                  certificates = [{ cert = \"a.pem\", key = \"a.key\", server_names = [\"a.example\", \"*.b.example\"] }]\n";
    let c = p(ok).unwrap();
    assert_eq!(c.tls_listeners["public"].alpn, ["h2", "http/1.1"]);
    let e = p(&ok.replace("listen = \"127.0.0.1:8443\"\n", "")).unwrap_err();
    assert!(
        e.to_string()
            .contains("key `tls_listeners.public`: missing key `listen`"),
        "{e}"
    );
    let e = p(&ok.replace("8443", "8080")).unwrap_err();
    assert!(
        e.to_string().contains("key `tls_listeners.public.listen`"),
        "{e}"
    );
    let e = p(&format!("{ok}alpn = [\"spdy/3\"]\n")).unwrap_err();
    assert!(
        e.to_string().contains("key `tls_listeners.public.alpn[0]`"),
        "{e}"
    );
    let e = p(&ok.replace("*.b.example", "b..example")).unwrap_err();
    assert!(
        e.to_string()
            .contains("key `tls_listeners.public.certificates[0].server_names[1]`"),
        "{e}"
    );
    let e = p(&ok.replace(", key = \"a.key\"", "")).unwrap_err();
    assert!(
        e.to_string().contains("certificates[0].key`: missing"),
        "{e}"
    );
}

#[test]
fn status_sets_parse_codes_classes_and_ranges() {
    let s = StatusSet::parse(&["204".into(), "3xx".into(), "400-404".into()]).unwrap();
    assert!(s.contains(204) && s.contains(302) && s.contains(404));
    assert!(!s.contains(200) && !s.contains(500));
    assert!(StatusSet::parse(&["2x".into()]).is_err());
    assert!(StatusSet::parse(&[]).is_err());
}
