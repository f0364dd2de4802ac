//! `vigil check` run as a real process against real endpoints on loopback: testkit
//! backends and small ad-hoc servers. Each test checks the exit code, and what the
//! operator reads on stdout/stderr.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use vigil_core::Status;
use vigil_testkit::{Backend, Mode};

fn vigil_check(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vigil"))
        .arg("check")
        .args(args)
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .output()
        .expect("run vigil")
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited, not killed")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn url(addr: SocketAddr, path: &str) -> String {
    format!("http://{addr}{path}")
}

/// A one-shot-per-connection HTTP server answering every request with `response`
/// (raw bytes), on its own thread; lives as long as the test process.
fn canned(response: &'static [u8]) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(response);
        }
    });
    addr
}

#[test]
fn pass_exits_0_with_a_summary_of_each_check() {
    let b = Backend::start("svc");
    b.set_check("disk:free", Status::Pass);
    b.set_check("postgres:connect", Status::Pass);
    let o = vigil_check(&[&url(b.addr(), "/health")]);
    assert_eq!(code(&o), 0, "stderr: {}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("PASS  http://"), "{out}");
    assert!(out.contains("HTTP 200"), "{out}");
    assert!(out.contains(" ms)"), "latency is shown: {out}");
    assert!(out.contains("pass  disk:free"), "{out}");
    assert!(out.contains("pass  postgres:connect"), "{out}");
}

#[test]
fn warn_exits_0_and_1_with_strict() {
    let b = Backend::start("svc");
    b.set_check("cache:ping", Status::Warn);
    let u = url(b.addr(), "/health");
    let o = vigil_check(&[&u]);
    assert_eq!(code(&o), 0, "warn is serving: exit 0 without --strict");
    assert!(stdout(&o).starts_with("WARN"), "{}", stdout(&o));
    let o = vigil_check(&[&u, "--strict"]);
    assert_eq!(code(&o), 1, "--strict turns warn into exit 1");
}

#[test]
fn fail_exits_2_and_names_the_failing_check() {
    let b = Backend::start("svc");
    b.set_check("disk:free", Status::Fail);
    b.set_check("mem:rss", Status::Pass);
    let o = vigil_check(&[&url(b.addr(), "/readyz")]);
    assert_eq!(code(&o), 2, "stderr: {}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("FAIL"), "{out}");
    assert!(out.contains("HTTP 503"), "{out}");
    assert!(out.contains("fail  disk:free"), "{out}");
}

#[test]
fn json_output_is_one_object_with_the_report() {
    let b = Backend::start("svc");
    b.set_check("disk:free", Status::Fail);
    let o = vigil_check(&[&url(b.addr(), "/health"), "--json"]);
    assert_eq!(code(&o), 2);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim())
        .unwrap_or_else(|e| panic!("--json must print JSON ({e}): {}", stdout(&o)));
    assert_eq!(v["status"], "fail");
    assert_eq!(v["httpStatus"], 503);
    assert_eq!(v["exitCode"], 2);
    assert!(v["latencyMs"].as_f64().is_some());
    assert_eq!(v["report"]["checks"]["disk:free"][0]["status"], "fail");
}

#[test]
fn refused_connection_exits_3_with_the_reason_on_stderr() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    }; // dropped: nothing listens there now
    let o = vigil_check(&[&url(addr, "/health"), "--json"]);
    assert_eq!(code(&o), 3);
    let err = stderr(&o);
    assert!(err.contains("unreachable"), "{err}");
    assert!(err.contains("refused"), "{err}");
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["status"], "invalid");
    assert_eq!(v["exitCode"], 3);
}

#[test]
fn garbage_that_is_not_http_exits_3() {
    let b = Backend::start("svc");
    b.set_mode(Mode::Garbage);
    let o = vigil_check(&[&url(b.addr(), "/status")]);
    assert_eq!(code(&o), 3, "stdout: {}", stdout(&o));
    assert!(stderr(&o).contains("invalid response"), "{}", stderr(&o));
}

#[test]
fn a_body_that_is_not_health_json_exits_3() {
    let addr = canned(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 21\r\nconnection: close\r\n\r\n<html>it works</html>",
    );
    let o = vigil_check(&[&url(addr, "/health")]);
    assert_eq!(code(&o), 3);
    let err = stderr(&o);
    assert!(err.contains("not health+json"), "{err}");
    assert!(err.contains("not JSON"), "the parse error says why: {err}");

    let addr = canned(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 16\r\nconnection: close\r\n\r\n{\"healthy\":true}",
    );
    let o = vigil_check(&[&url(addr, "/health")]);
    assert_eq!(code(&o), 3);
    assert!(
        stderr(&o).contains("$.status: missing required field"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn an_unexpected_status_code_exits_3() {
    let addr = canned(
        b"HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: 9\r\nconnection: close\r\n\r\nnot found",
    );
    let o = vigil_check(&[&url(addr, "/helth")]);
    assert_eq!(code(&o), 3);
    assert!(stderr(&o).contains("404"), "{}", stderr(&o));
}

#[test]
fn status_only_livez_is_judged_by_its_code() {
    let b = Backend::start("svc");
    let o = vigil_check(&[&url(b.addr(), "/livez")]);
    assert_eq!(code(&o), 0, "stderr: {}", stderr(&o));
    assert!(stdout(&o).contains("status-only"), "{}", stdout(&o));
}

#[test]
fn a_503_whose_body_says_pass_counts_as_fail() {
    let addr = canned(
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/health+json\r\ncontent-length: 17\r\nconnection: close\r\n\r\n{\"status\":\"pass\"}",
    );
    let o = vigil_check(&[&url(addr, "/health")]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("counting fail"), "{}", stderr(&o));
}

#[test]
fn a_frozen_endpoint_times_out_with_exit_3() {
    let b = Backend::start("svc");
    b.set_health_mode(Mode::Freeze);
    let t = Instant::now();
    let o = vigil_check(&[&url(b.addr(), "/health"), "--timeout", "300ms"]);
    assert_eq!(code(&o), 3);
    assert!(
        stderr(&o).contains("timed out after 300ms"),
        "{}",
        stderr(&o)
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "--timeout must bound the probe, took {:?}",
        t.elapsed()
    );
}

#[test]
fn a_url_without_scheme_means_http() {
    let b = Backend::start("svc");
    let o = vigil_check(&[&format!("{}/health", b.addr())]);
    assert_eq!(code(&o), 0, "stderr: {}", stderr(&o));
}

// === https ===

#[path = "../tls_support/mod.rs"]
mod tls_support;

const PASS: &str = r#"{"status":"pass","checks":{"disk:free":[{"status":"pass"}]}}"#;

#[test]
fn https_passes_with_the_ca_file_and_is_unreachable_without_it() {
    let pki = tls_support::Pki::new();
    let addr = pki.serve(tls_support::health_json(PASS));
    let u = format!("https://{addr}/health");
    let ca = pki.ca_path();
    let o = vigil_check(&[&u, "--ca-file", ca.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "trusted through --ca-file: {}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("PASS  https://"), "{out}");
    assert!(out.contains("pass  disk:free"), "{out}");

    let o = vigil_check(&[&u, "--json"]);
    assert_eq!(code(&o), 3, "an untrusted certificate is unreachable");
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "vigil check: {u}: certificate not trusted: UnknownIssuer"
        )),
        "the reason is on stderr: {err}"
    );
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["status"], "invalid");
    assert_eq!(v["exitCode"], 3);
}

#[test]
fn an_unusable_ca_file_exits_3_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let o = vigil_check(&[
        "https://127.0.0.1:1/health",
        "--ca-file",
        junk.to_str().unwrap(),
    ]);
    assert_eq!(code(&o), 3);
    let err = stderr(&o);
    assert!(
        err.contains(&format!("--ca-file {}: no CERTIFICATE", junk.display())),
        "{err}"
    );
}
