//! `vigil controller` probing https:// targets: real rustls servers on loopback with
//! certificates of a test CA, trusted through `[probe] ca_file`, judged as health+json;
//! a target whose certificate no trusted CA signed fails with the reason.

use crate::controller_support;

use controller_support::*;

#[path = "../tls_support/mod.rs"]
mod tls_support;

fn config(ca: &std::path::Path, targets: &str) -> String {
    format!(
        r#"
listen = "127.0.0.1:0"
data_dir = "data"
api_token = "{TOKEN}"
[probe]
interval = "200ms"
timeout = "1s"
jitter = 0.1
answers = "health+json"
ca_file = "{}"
[guard]
grace = "0s"
min_failing = "1s"
{targets}"#,
        ca.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_targets_are_probed_over_tls_trusted_by_the_ca_file_and_judged() {
    let pki = tls_support::Pki::new();
    let pass = pki.serve(tls_support::health_json(
        r#"{"status":"pass","checks":{"disk:free":[{"status":"pass"}]}}"#,
    ));
    let failing = r#"{"status":"fail","checks":{"db:ping":[{"status":"fail"}]}}"#;
    let fail = pki.serve(format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/health+json\r\ncontent-length: {}\r\n\r\n{failing}",
        failing.len()
    ));
    // Another CA's certificate: not trusted by ca_file, nor by the system.
    let stranger = tls_support::Pki::named("a stranger CA")
        .serve(tls_support::health_json(r#"{"status":"pass"}"#));
    let targets = format!(
        "[[targets]]\nid = \"ok\"\nurl = \"https://{pass}\"\n\
         [[targets]]\nid = \"bad\"\nurl = \"https://{fail}\"\n\
         [[targets]]\nid = \"stranger\"\nurl = \"https://{stranger}\"\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), &config(&pki.ca_path(), &targets));
    let last = |id: &'static str| {
        let c = &c;
        async move { c.get(&format!("/api/targets/{id}")).await["target"]["last_probe"].clone() }
    };
    let ok = c
        .wait_for("target ok healthy over https", || async {
            let p = last("ok").await;
            (p["ok"] == true).then_some(p)
        })
        .await;
    assert_eq!(ok["status"], 200, "{ok}");
    assert_eq!(ok["health"], "pass", "the health+json report is read: {ok}");
    let bad = c
        .wait_for("target bad probed", || async {
            let p = last("bad").await;
            p["status"].is_u64().then_some(p)
        })
        .await;
    assert_eq!(bad["ok"], false, "{bad}");
    assert_eq!(bad["health"], "fail", "{bad}");
    assert_eq!(bad["detail"], "failing: db:ping", "{bad}");
    let stranger = c
        .wait_for("target stranger probed", || async {
            let p = last("stranger").await;
            p["detail"]
                .as_str()
                .is_some_and(|d| !d.is_empty())
                .then_some(p)
        })
        .await;
    assert_eq!(stranger["ok"], false, "{stranger}");
    assert_eq!(
        stranger["detail"], "certificate not trusted: UnknownIssuer",
        "{stranger}"
    );
    assert!(c.sigterm().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_file_that_is_not_pem_refuses_the_config_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    std::fs::write(dir.path().join("fleet.toml"), config(&junk, "")).unwrap();
    let o = std::process::Command::new(vigil_bin())
        .args(["controller", "check-config", "-c"])
        .arg(dir.path().join("fleet.toml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "a bad config exits 78: {err}");
    assert!(err.contains("probe.ca_file"), "{err}");
    assert!(err.contains("no CERTIFICATE"), "{err}");
}
