//! docs/controller.md's minimal config for plain web servers (issue 34): the block the
//! page marks with `operator_docs.rs` parses, validates, and watches real plain web
//! servers (no health endpoint: `/` answers 200, everything else 404) as healthy; the
//! same block without its `[probe] path = "/"` fails them all, which is why the page
//! says the path is needed.

use crate::controller_support;

use controller_support::*;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;

const MARK: &str = "<!-- operator_docs.rs";

/// The ```toml block after the marker in docs/controller.md.
fn documented_block() -> String {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/controller.md");
    let text = std::fs::read_to_string(&page).expect("docs/controller.md");
    let after = &text[text
        .find(MARK)
        .expect("docs/controller.md marks its minimal config")..];
    let body = &after[after
        .find("```toml\n")
        .expect("a toml block after the mark")
        + 8..];
    body[..body.find("```").expect("the block ends")].to_string()
}

/// A plain web server on loopback: 200 with a page for `/`, 404 for anything else.
fn plain_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut w = conn;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                    // Headers up to the blank line (no bodies in probes).
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        if h == "\r\n" {
                            break;
                        }
                    }
                    let (status, body) = if path == "/" {
                        ("200 OK", "<html><body>hello</body></html>")
                    } else {
                        ("404 Not Found", "<html><body>not found</body></html>")
                    };
                    let answer = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if w.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// The documented block, pointed at `servers`, made fast for a test (200 ms probes, no
/// grace) and kept local (port 0, data in the test's directory).
fn runnable(block: &str, servers: &[SocketAddr]) -> String {
    let mut doc: toml::Table = toml::from_str(block).expect("the documented block is TOML");
    let targets = doc["targets"].as_array_mut().expect("[[targets]]");
    assert_eq!(
        targets.len(),
        servers.len(),
        "one server per documented target"
    );
    for (t, s) in targets.iter_mut().zip(servers) {
        t["url"] = toml::Value::String(format!("http://{s}"));
    }
    let probe = doc
        .entry("probe")
        .or_insert_with(|| toml::Value::Table(Default::default()))
        .as_table_mut()
        .unwrap();
    probe.insert("interval".into(), "200ms".into());
    probe.insert("timeout".into(), "1s".into());
    doc.insert("listen".into(), "127.0.0.1:0".into());
    doc.insert("data_dir".into(), "data".into());
    let mut guard = toml::Table::new();
    guard.insert("grace".into(), "0s".into());
    doc.insert("guard".into(), guard.into());
    toml::to_string(&doc).unwrap()
}

#[test]
fn the_documented_minimal_config_parses_and_validates() {
    let block = documented_block();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.toml");
    std::fs::write(&path, &block).unwrap();
    let c = vigil_controller::config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.probe.path, "/",
        "plain servers are probed on a page they serve"
    );
    assert_eq!(c.targets.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_minimal_config_watches_plain_web_servers_as_healthy() {
    let block = documented_block();
    let servers: Vec<SocketAddr> = (0..3).map(|_| plain_server()).collect();
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), &runnable(&block, &servers));
    c.wait_all(3, "healthy").await;
    drop(c);

    // Without its `path = "/"`, the same servers answer /health with a 404: all fail.
    let without = block.replace("[probe]\npath = \"/\"\n", "");
    assert_ne!(without, block, "the block sets [probe] path = \"/\"");
    let dir = tempfile::tempdir().unwrap();
    let c = Controller::start(dir.path(), &runnable(&without, &servers));
    c.wait_for("every plain server failing on /health", || async {
        let t = c.targets().await;
        (t.len() == 3 && t.iter().all(|t| t["last_probe"]["ok"] == false)).then_some(())
    })
    .await;
}
