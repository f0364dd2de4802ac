//! Issue 34, `vigil demo` as an operator meets it: `vigil demo 2>&1 | tee demo.log`,
//! then Ctrl-C, used to panic on the closed stderr (exit 101) and hang reading the
//! terminal until Enter; and `r` left a black-holed worker-3 paused by its own kill
//! switch (~45 s) although it promises to clear every fault.
//!
//! `VIGIL_TEST_BIN` runs them on another build (to show they fail on an older one).

use crate::demo_support;

use demo_support::{Demo, children_of, said, spawn_demo};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn vigil_bin() -> std::ffi::OsString {
    std::env::var_os("VIGIL_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_vigil").into())
}

/// Waits for `cond` up to `limit`, polling every 100 ms; panics naming `what`.
fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `vigil demo 2>&1 | tee log` in a terminal, then Ctrl-C: SIGINT to the whole
/// foreground group, so `tee` dies with it and the demo's stdout *and* stderr are
/// closed pipes from then on. Its stdin, the terminal, stays open and silent.
#[test]
fn heavy_demo_with_stdout_and_stderr_piped_into_tee_stops_on_ctrl_c() {
    const BASE: u16 = 18100;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("demo.log");
    let (pipe_r, pipe_w) = std::io::pipe().unwrap();
    let mut demo = Command::new(vigil_bin())
        .args(["demo", "--base-port", &BASE.to_string()])
        .args(["--services", "2", "--rps", "20", "--no-queue"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--db", "postgres://nobody@127.0.0.1:1/none"])
        // The terminal: open, nobody types.
        .stdin(Stdio::piped())
        // 2>&1 | tee
        .stdout(pipe_w.try_clone().unwrap())
        .stderr(pipe_w)
        .process_group(0)
        .spawn()
        .expect("start vigil demo");
    let demo_pid = demo.id();
    let _terminal = demo.stdin.take();
    let mut tee = Command::new("tee")
        .arg(&log)
        .stdin(pipe_r)
        .stdout(Stdio::null())
        .process_group(demo_pid as i32)
        .spawn()
        .expect("start tee");
    let demo = Demo(demo);
    wait_until(
        "the demo says it is running",
        Duration::from_secs(60),
        || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("vigil demo is running")),
    );
    let children = children_of(demo_pid);
    assert_eq!(
        children.len(),
        2 + 2,
        "services, lb, controller: {children:?}"
    );

    // Ctrl-C: SIGINT to every process of the foreground group, tee included.
    rustix::process::kill_process_group(
        rustix::process::Pid::from_raw(demo_pid as i32).unwrap(),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let _ = tee.wait();
    let mut demo = demo;
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = demo.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not stop within 30s of Ctrl-C with stdout and stderr closed \
             (hung reading the terminal?):\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        matches!(status.code(), Some(0 | 130)),
        "Ctrl-C stops the demo cleanly (0 or 130), not a panic on the closed pipes (101): {status}"
    );
    for pid in children {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty(),
            "child {pid} of the demo left behind after it exited: {stat}"
        );
    }
}

/// `h` then `r`: the reset clears every fault, the black hole's kill-switch pause
/// included (the worker's own gate remembers its trip; its fault switch alone does not
/// end the pause). Needs the machine's RabbitMQ (every machine has it, CI's included).
#[test]
fn heavy_demo_reset_key_ends_worker_3s_kill_switch_pause_at_once() {
    const BASE: u16 = 18200;
    let dir = tempfile::tempdir().unwrap();
    let args = vec![
        "--base-port".to_string(),
        BASE.to_string(),
        "--services".into(),
        "2".into(),
        "--rps".into(),
        "5".into(),
        "--data-dir".into(),
        dir.path().display().to_string(),
        "--db".into(),
        "postgres://nobody@127.0.0.1:1/none".into(),
    ];
    let (_demo, mut keys, narration) = spawn_demo(&args);
    let limit = Duration::from_secs(60);
    wait_until("the demo runs its queue", limit, || {
        said(&narration, &["worker-4", "/worker"]) && said(&narration, &["vigil demo is running"])
    });
    assert!(
        !said(&narration, &["no queue"]),
        "this test needs RabbitMQ on 127.0.0.1:5672"
    );
    writeln!(keys, "h").unwrap();
    wait_until("worker-3's kill switch pauses it", limit, || {
        said(&narration, &["worker-3 STOPPED PULLING", "kill switch"])
    });
    writeln!(keys, "r").unwrap();
    wait_until("the reset is applied", limit, || {
        said(&narration, &["RESET every injected fault"])
    });
    let reset_at = Instant::now();
    // The kill switch's first pause is 60 s: pulling again within 15 s is the reset's
    // doing, not the pause running out.
    wait_until(
        "worker-3 pulls again soon after the reset",
        Duration::from_secs(15),
        || said(&narration, &["worker-3", "pulls again"]),
    );
    eprintln!(
        "worker-3 pulled again {:?} after the reset",
        reset_at.elapsed()
    );
}
