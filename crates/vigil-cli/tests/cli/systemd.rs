//! `Type=notify` as systemd sees it: the test plays the service manager with a unix
//! datagram socket in `$NOTIFY_SOCKET` and `$WATCHDOG_USEC` set, and checks what the real
//! `vigil lb` and `vigil controller` send: `READY=1` once they serve, `WATCHDOG=1` pings,
//! `RELOADING=1` (with `MONOTONIC_USEC`) then `READY=1` on SIGHUP, `STOPPING=1` on
//! SIGTERM, then a clean exit.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The service manager's end.
struct Manager {
    sock: UnixDatagram,
    watchdog_pings: usize,
}

impl Manager {
    fn new(path: &Path) -> Manager {
        let sock = UnixDatagram::bind(path).expect("bind the notify socket");
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        Manager {
            sock,
            watchdog_pings: 0,
        }
    }

    /// The next message that is not a watchdog ping (those are counted), within 20 s.
    fn next(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut buf = [0u8; 4096];
        loop {
            assert!(Instant::now() < deadline, "no notification within 20s");
            let Ok(n) = self.sock.recv(&mut buf) else {
                continue;
            };
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            if msg == "WATCHDOG=1\n" {
                self.watchdog_pings += 1;
                continue;
            }
            return msg;
        }
    }

    /// Waits until `n` watchdog pings have arrived in all, failing on any other message.
    fn pings(&mut self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut buf = [0u8; 4096];
        while self.watchdog_pings < n {
            assert!(
                Instant::now() < deadline,
                "only {} watchdog pings in 20s",
                self.watchdog_pings
            );
            if let Ok(n) = self.sock.recv(&mut buf) {
                let msg = String::from_utf8_lossy(&buf[..n]);
                assert_eq!(msg, "WATCHDOG=1\n", "only pings while nothing happens");
                self.watchdog_pings += 1;
            }
        }
    }
}

fn signal(child: &Child, sig: rustix::process::Signal) {
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        sig,
    )
    .unwrap();
}

/// One plain HTTP/1.0 GET of `addr` `path` (`"127.0.0.1:9/livez"`): true on a 200.
fn answers_200(url: &str) -> bool {
    use std::io::{Read, Write};
    let (addr, path) = url.split_once('/').unwrap();
    let Ok(mut tcp) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(5)));
    if write!(tcp, "GET /{path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    tcp.read_exact(&mut head).is_ok() && head.ends_with(b" 200")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `vigil <verb> -c config` under a fake service manager and walks it through
/// start, reload and stop; `serves` is a URL that must answer once READY=1 is sent.
fn walk(dir: &Path, verb: &str, config: &str, serves: &str) {
    let file = dir.join(format!("{verb}.toml"));
    std::fs::write(&file, config).unwrap();
    let notify = dir.join(format!("{verb}.notify"));
    let mut manager = Manager::new(&notify);
    let child = Command::new(env!("CARGO_BIN_EXE_vigil"))
        .args([verb, "-c"])
        .arg(&file)
        .env("NOTIFY_SOCKET", &notify)
        // WatchdogSec=300ms: a ping every 150 ms.
        .env("WATCHDOG_USEC", "300000")
        .env_remove("WATCHDOG_PID")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start vigil");
    let mut daemon = Daemon(child);

    let ready = manager.next();
    assert!(
        ready.starts_with("READY=1\nSTATUS=serving on "),
        "{verb}: READY=1 with a status first: {ready:?}"
    );
    assert!(
        answers_200(serves),
        "{verb}: serving ({serves}) once READY=1 is sent"
    );
    manager.pings(2);

    signal(&daemon.0, rustix::process::Signal::HUP);
    let reloading = manager.next();
    assert!(
        reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="),
        "{verb}: SIGHUP: {reloading:?}"
    );
    let again = manager.next();
    assert!(
        again.starts_with("READY=1\n"),
        "{verb}: READY=1 after the reload: {again:?}"
    );

    signal(&daemon.0, rustix::process::Signal::TERM);
    assert_eq!(manager.next(), "STOPPING=1\n", "{verb}: SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = daemon.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "{verb}: no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{verb}: {status}");
}

#[test]
fn lb_speaks_the_notify_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let (listen, admin) = (free_port(), free_port());
    walk(
        dir.path(),
        "lb",
        &format!(
            "listen = \"127.0.0.1:{listen}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\
             drain_timeout = \"1s\"\n\n[pools.api]\ntargets = [{{ addr = \"127.0.0.1:1\" }}]\n"
        ),
        &format!("127.0.0.1:{admin}/livez"),
    );
}

#[test]
fn controller_speaks_the_notify_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let data = dir.path().join("data");
    walk(
        dir.path(),
        "controller",
        &format!(
            "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\n\n[[targets]]\nid = \"a\"\nurl = \"http://127.0.0.1:1\"\n",
            data.display()
        ),
        &format!("127.0.0.1:{port}/livez"),
    );
}

/// The unit files shipped under packaging/systemd pass `systemd-analyze verify` with no
/// warning (ExecStart pointed at this build's binary). Skipped, saying so, where
/// systemd-analyze is not installed.
#[test]
fn packaged_unit_files_verify_clean() {
    let Ok(version) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("SKIPPED: systemd-analyze is not installed (Debian package systemd)");
        return;
    };
    assert!(version.status.success());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/systemd");
    let dir = tempfile::tempdir().unwrap();
    let mut units = Vec::new();
    for unit in ["vigil-lb.service", "vigil-controller.service"] {
        let text = std::fs::read_to_string(root.join(unit)).unwrap();
        assert!(text.contains("Type=notify"), "{unit}: Type=notify");
        assert!(text.contains("WatchdogSec="), "{unit}: a watchdog");
        for option in [
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "DynamicUser=yes",
        ] {
            assert!(text.contains(option), "{unit}: hardening {option}");
        }
        let path = dir.path().join(unit);
        std::fs::write(
            &path,
            text.replace("/usr/local/bin/vigil", env!("CARGO_BIN_EXE_vigil")),
        )
        .unwrap();
        units.push(path);
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&units)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
}
