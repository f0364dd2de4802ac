//! `[access_log]`: one JSON line per request, through the real binary, its file read
//! back; off by default; a log that cannot be written costs no request.

use super::*;
use std::process::Stdio;

/// No health checks, so that a dead target stays in service and requests to it are
/// answered by vigil itself (502) or retried.
const NO_CHECKS: &str = "[pools.web.health_check]\nenabled = false\n";

/// The lines of `path` once it holds at least `n` (polled, at most 10 s), each parsed.
async fn lines(path: &std::path::Path, n: usize, log: impl Fn() -> String) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= n {
            assert!(text.ends_with('\n'), "whole lines only: {text:?}");
            return text
                .lines()
                .map(|l| {
                    serde_json::from_str(l)
                        .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {l:?}"))
                })
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "{n} access log lines expected in {}, found:\n{text}\nlog:\n{}",
            path.display(),
            log()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A port nobody listens on.
fn dead_addr() -> String {
    format!("127.0.0.1:{}", lb_support::free_port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_is_one_json_line_with_status_target_attempts_and_times() {
    let good = Backend::start("good");
    let dead = dead_addr();
    let lb = Lb::start(&format!(
        "[access_log]\nenabled = true\npath = \"access.log\"\n\n\
         [[routes]]\npath_prefix = \"/broken\"\npool = \"broken\"\n\
         [[routes]]\npool = \"web\"\n\n\
         [pools.web]\nbalance = \"round-robin\"\n\
         targets = [{{ addr = \"{dead}\" }}, {{ addr = \"{}\" }}]\n{NO_CHECKS}\
         [pools.broken]\ntargets = [{{ addr = \"{dead}\" }}]\n\
         [pools.broken.health_check]\nenabled = false\n",
        good.addr()
    ))
    .await;
    let file = lb.config.parent().unwrap().join("access.log");

    // A 200, with a query string that must not be logged.
    let resp = lb
        .http
        .get(lb.url("/hello?token=secret"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.bytes().await.unwrap();
    let v = lines(&file, 1, || lb.log()).await;
    let ok = &v[0];
    assert_eq!(ok["status"], 200, "{ok}");
    assert_eq!(ok["method"], "GET");
    assert_eq!(ok["path"], "/hello", "the path only, never the query: {ok}");
    assert_eq!(ok["pool"], "web");
    assert_eq!(ok["proto"], "HTTP/1.1");
    assert_eq!(ok["bytes_in"], 0);
    assert_eq!(ok["bytes_out"], body.len() as u64, "{ok}");
    assert!(
        ok["client"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{ok}"
    );
    let time = ok["time"].as_str().unwrap();
    assert!(
        time.ends_with('Z') && humantime::parse_rfc3339(time).is_ok(),
        "RFC 3339 UTC: {time}"
    );
    assert!(ok["duration_ms"].as_f64().unwrap() > 0.0, "{ok}");
    assert!(ok["upstream_ms"].as_f64().unwrap() > 0.0, "{ok}");
    assert!(ok["error"].is_null());
    // The first attempt may have gone to the dead target and been retried.
    let attempts = ok["attempts"].as_u64().unwrap();
    assert_eq!(ok["target"], good.addr().to_string(), "{ok}");
    assert!((1..=2).contains(&attempts), "{ok}");

    // A pool whose only target is down: vigil answers 502 itself, no target.
    let resp = lb.http.get(lb.url("/broken/x")).send().await.unwrap();
    assert_eq!(resp.status(), 502);
    let v = lines(&file, 2, || lb.log()).await;
    let bad = &v[1];
    assert_eq!(bad["status"], 502, "{bad}");
    assert!(
        bad["target"].is_null(),
        "vigil answered, no target did: {bad}"
    );
    assert_eq!(bad["attempts"], 1, "{bad}");
    assert!(bad["upstream_ms"].is_null(), "{bad}");
    assert!(
        bad["error"].as_str().unwrap().contains(&dead),
        "why vigil answered, naming the target: {bad}"
    );

    // A request whose first attempt hit the dead target and was retried on the good
    // one: attempts 2 (round-robin: every other request goes to the dead one first).
    let mut n = 2;
    let mut retried = None;
    for _ in 0..40 {
        let resp = lb.http.get(lb.url("/again")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "a connect failure is retried");
        n += 1;
        let v = lines(&file, n, || lb.log()).await;
        if v[n - 1]["attempts"] == 2 {
            retried = Some(v[n - 1].clone());
            break;
        }
    }
    let retried = retried.expect("one of 40 requests first tried the dead target");
    assert_eq!(retried["status"], 200);
    assert_eq!(retried["target"], good.addr().to_string(), "{retried}");

    // Hostile paths: quotes, backslashes, markup, control characters percent-encoded
    // (the parser refuses them raw, as it refuses bytes that are not ASCII), and 8 KiB:
    // each stays one line of valid JSON.
    let long = format!("/{}", "a".repeat(8 * 1024));
    let hostile: [&[u8]; 3] = [
        b"GET /q\"uote\\back%0A%0Dnl%22%00 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET /<script>'{}'|^` HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        format!("GET {long} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .into_bytes()
            .leak(),
    ];
    let mut statuses = Vec::new();
    for req in hostile {
        // Forwarded, whatever the target thinks of it (hyper refuses some with 400).
        let answer = raw(lb.port, req, None).await;
        let status: u16 = answer
            .strip_prefix("HTTP/1.1 ")
            .and_then(|a| a.get(..3))
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("an HTTP answer: {answer}"));
        statuses.push(status);
    }
    let v = lines(&file, n + 3, || lb.log()).await;
    for (i, status) in statuses.iter().enumerate() {
        assert_eq!(v[n + i]["status"], *status, "{}", v[n + i]);
        assert_eq!(v[n + i]["target"], good.addr().to_string(), "{}", v[n + i]);
    }
    assert_eq!(
        v.len(),
        n + 3,
        "one line per request, no line broken in two"
    );
    assert_eq!(v[n]["path"], "/q\"uote\\back%0A%0Dnl%22%00");
    assert_eq!(v[n + 1]["path"], "/<script>'{}'|^`");
    assert_eq!(v[n + 2]["path"], long.as_str());
    let metrics = lb.metrics().await;
    assert!(
        metrics.contains("vigil_lb_access_log_dropped_total 0"),
        "nothing dropped at this pace:\n{metrics}"
    );
}

/// `vigil lb` on `body` with its standard output kept, for the default path `-`:
/// (process, port, standard output's file).
async fn start_keeping_stdout(body: &str) -> (LbProcess, std::path::PathBuf) {
    let lb = LbProcess::start(body).await;
    // Restarted on the same file with stdout kept: LbProcess throws it away.
    let out = lb.config.parent().unwrap().join("stdout");
    let mut lb = lb;
    lb.child.kill().unwrap();
    lb.child.wait().unwrap();
    lb.child = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args(["lb", "-c"])
        .arg(&lb.config)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", lb.port))
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "vigil lb did not restart");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    (lb, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_logs_are_off_by_default_and_go_to_stdout_when_on() {
    let b = Backend::start("b");
    let pool = format!(
        "[pools.web]\ntargets = [{{ addr = \"{}\" }}]\n{NO_CHECKS}",
        b.addr()
    );
    for (section, want) in [("", 0), ("[access_log]\nenabled = true\n", 5)] {
        let (lb, out) = start_keeping_stdout(&format!("{section}{pool}")).await;
        for _ in 0..5 {
            let a = raw(
                lb.port,
                b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                None,
            )
            .await;
            assert!(a.starts_with("HTTP/1.1 200"), "{a}");
        }
        if want > 0 {
            let v = lines(&out, want, String::new).await;
            assert!(v.iter().all(|l| l["status"] == 200 && l["path"] == "/x"));
        } else {
            // Give a writer that should not exist the time to show itself.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let text = std::fs::read_to_string(&out).unwrap();
            assert_eq!(text, "", "off by default: nothing on stdout");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_or_an_unwritable_path_costs_no_request_and_is_counted() {
    let b = Backend::start("b");
    // /dev/full: every write fails with ENOSPC (a full disk). /sys: no file can be
    // created there, even by root (a read-only place).
    for (path, says) in [
        ("/dev/full", "cannot write to /dev/full"),
        ("/sys/vigil-access.log", "cannot open /sys/vigil-access.log"),
    ] {
        let lb = Lb::start(&format!(
            "[access_log]\nenabled = true\npath = \"{path}\"\n\
             [pools.web]\ntargets = [{{ addr = \"{}\" }}]\n{NO_CHECKS}",
            b.addr()
        ))
        .await;
        for _ in 0..20 {
            let resp = lb.http.get(lb.url("/x")).send().await.unwrap();
            assert_eq!(resp.status(), 200, "proxying goes on ({path})");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let m = lb.metrics().await;
            let errors = m
                .lines()
                .find_map(|l| l.strip_prefix("vigil_lb_access_log_write_errors_total "))
                .and_then(|v| v.parse::<u64>().ok());
            if errors == Some(20) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "every line not written is counted ({path}): {errors:?}\n{m}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let log = lb.log();
        assert_eq!(log.matches(says).count(), 1, "logged once ({path}):\n{log}");
    }
}
