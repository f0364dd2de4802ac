//! The built-in local checks against the real machine: statvfs, /proc, cgroup files,
//! real processes and real HTTP requests holding in-flight guards.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vigil::Check;
use vigil::checks::{
    Amount, CgroupMemory, CgroupVersion, DiskSpace, Memory, ProcessAlive, Saturation,
};
use vigil::{CheckResult, Status};

fn output(o: &CheckResult) -> &str {
    o.output.as_deref().unwrap_or("")
}

// === DiskSpace ===

#[tokio::test]
async fn disk_space_grades_the_real_filesystem_against_its_levels() {
    let dir = tempfile::tempdir().unwrap();
    // Any filesystem that is not completely full has at least one byte free.
    let ok = DiskSpace::new(dir.path())
        .no_warn()
        .fail_below(Amount::Bytes(1))
        .check()
        .await;
    assert_eq!(ok.status, Status::Pass, "{}", output(&ok));
    assert_eq!(ok.observed_unit.as_deref(), Some("bytes"));
    assert!(ok.observed_value.as_ref().and_then(|v| v.as_u64()).unwrap() > 0);

    // No filesystem in use is 100% free.
    let failed = DiskSpace::new(dir.path())
        .fail_below(Amount::Percent(100.0))
        .check()
        .await;
    assert_eq!(failed.status, Status::Fail, "{}", output(&failed));
    assert_eq!(failed.observed_unit.as_deref(), Some("percent"));
    assert!(
        output(&failed).contains("below the fail level 100%"),
        "{}",
        output(&failed)
    );

    let warned = DiskSpace::new(dir.path())
        .warn_below(Amount::Percent(100.0))
        .fail_below(Amount::Bytes(0))
        .check()
        .await;
    assert_eq!(warned.status, Status::Warn, "{}", output(&warned));
}

#[tokio::test]
async fn disk_space_fails_for_a_path_that_does_not_exist() {
    let o = DiskSpace::new("/nonexistent/vigil/path").check().await;
    assert_eq!(o.status, Status::Fail);
    assert!(output(&o).contains("cannot stat"), "{}", output(&o));
}

// === Memory ===

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[tokio::test]
async fn memory_grades_the_cgroup_v2_working_set() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "memory.max", "1000000\n");
    write(dir.path(), "memory.current", "990000\n");
    write(
        dir.path(),
        "memory.stat",
        "anon 100\ninactive_file 0\nactive_file 5\n",
    );
    let check = Memory::new().cgroup(CgroupMemory::at(CgroupVersion::V2, dir.path()));
    let o = check.check().await;
    assert_eq!(
        o.status,
        Status::Fail,
        "99% of the cgroup limit must fail: {}",
        output(&o)
    );
    assert_eq!(o.observed_value, Some(990000.into()));

    // Most of it is reclaimable page cache: the working set is 49%.
    write(
        dir.path(),
        "memory.stat",
        "anon 100\ninactive_file 500000\n",
    );
    let o = check.check().await;
    assert_eq!(
        o.status,
        Status::Pass,
        "page cache is not pressure: {}",
        output(&o)
    );
    assert_eq!(o.observed_value, Some(490000.into()));

    write(dir.path(), "memory.max", "max\n");
    let o = check.check().await;
    assert_eq!(o.status, Status::Pass);
    assert!(
        output(&o).contains("cgroup sets no limit"),
        "{}",
        output(&o)
    );
}

#[tokio::test]
async fn memory_takes_the_smallest_v2_limit_up_the_hierarchy() {
    let mount = tempfile::tempdir().unwrap();
    let leaf = mount.path().join("app.slice/app.service");
    std::fs::create_dir_all(&leaf).unwrap();
    write(mount.path(), "memory.max", "max\n");
    write(&mount.path().join("app.slice"), "memory.max", "1000000\n");
    write(&leaf, "memory.max", "max\n");
    write(&leaf, "memory.current", "850000\n");
    let cgroup = CgroupMemory {
        version: CgroupVersion::V2,
        dir: leaf.clone(),
        mount: mount.path().to_path_buf(),
    };
    let o = Memory::new().cgroup(cgroup).check().await;
    assert_eq!(
        o.status,
        Status::Warn,
        "85% of the parent's limit must warn: {}",
        output(&o)
    );
}

#[tokio::test]
async fn memory_reads_cgroup_v1_and_its_hierarchical_limit() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "memory.limit_in_bytes", "9223372036854771712\n");
    write(dir.path(), "memory.usage_in_bytes", "970000\n");
    write(
        dir.path(),
        "memory.stat",
        "cache 10\nhierarchical_memory_limit 1000000\ntotal_inactive_file 0\n",
    );
    let o = Memory::new()
        .cgroup(CgroupMemory::at(CgroupVersion::V1, dir.path()))
        .check()
        .await;
    assert_eq!(o.status, Status::Fail, "{}", output(&o));
    assert!(output(&o).contains("cgroup V1"), "{}", output(&o));
}

#[tokio::test]
async fn memory_fails_when_rss_grows_past_its_limit_and_recovers() {
    let baseline = Memory::new().ignore_cgroup().check().await;
    assert_eq!(baseline.status, Status::Pass, "{}", output(&baseline));
    let rss = baseline.observed_value.unwrap().as_u64().unwrap();
    assert!(rss > 0);

    let check = Memory::new().ignore_cgroup().rss_limit(rss + (64 << 20));
    let before = check.check().await;
    assert_ne!(before.status, Status::Fail, "{}", output(&before));

    // Touch 128 MiB for real: the RSS grows past the limit.
    let mut block = vec![0u8; 128 << 20];
    for page in block.chunks_mut(4096) {
        page[0] = 1;
    }
    let during = check.check().await;
    assert_eq!(
        during.status,
        Status::Fail,
        "RSS over the limit must fail: {}",
        output(&during)
    );
    assert!(
        std::hint::black_box(&block)
            .iter()
            .step_by(4096)
            .all(|b| *b == 1)
    );
    drop(block);

    // A large allocation is unmapped on free: the RSS drops back.
    let after = check.check().await;
    assert_ne!(
        after.status,
        Status::Fail,
        "freed memory must restore: {}",
        output(&after)
    );
}

#[tokio::test]
async fn memory_detects_this_machines_cgroup_without_failing_to_read_it() {
    let o = Memory::new().check().await;
    assert_eq!(o.observed_unit.as_deref(), Some("bytes"), "{}", output(&o));
    assert!(
        !output(&o).contains("cannot read"),
        "the detected cgroup must be readable: {}",
        output(&o)
    );
}

// === Saturation ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturation_fails_while_real_requests_hold_every_slot() {
    let check = Saturation::in_flight(4);
    let tracker = check.tracker().unwrap();
    let release = Arc::new(tokio::sync::Notify::new());
    let app = {
        let release = release.clone();
        axum::Router::new().route(
            "/work",
            axum::routing::get(move || {
                let tracker = tracker.clone();
                let release = release.clone();
                async move {
                    let _guard = tracker.enter();
                    release.notified().await;
                    "done"
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    assert_eq!(check.check().await.status, Status::Pass);
    let client = reqwest::Client::new();
    let requests: Vec<_> = (0..4)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.get(format!("http://{addr}/work")).send().await })
        })
        .collect();
    let full = poll_until(|| async {
        let o = check.check().await;
        (o.status == Status::Fail).then_some(o)
    })
    .await
    .expect("4 of 4 requests in flight must fail the check");
    assert!(
        output(&full).contains("4 of 4 requests in flight"),
        "{}",
        output(&full)
    );

    release.notify_waiters();
    for r in requests {
        assert_eq!(r.await.unwrap().unwrap().status(), 200);
    }
    let o = check.check().await;
    assert_eq!(
        o.status,
        Status::Pass,
        "finished requests must leave flight: {}",
        output(&o)
    );
}

#[test]
fn saturation_sees_a_busy_runtime_and_an_idle_one() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let check = Saturation::runtime_busy(rt.handle().clone());
    let driver = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    driver.block_on(check.check());

    // Keep both workers polling for 600 ms, yielding often so tokio folds the busy time in.
    let busy: Vec<_> = (0..2)
        .map(|_| {
            rt.spawn(async {
                let until = Instant::now() + Duration::from_millis(600);
                while Instant::now() < until {
                    std::hint::black_box((0..1000u64).sum::<u64>());
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for task in busy {
        rt.block_on(task).unwrap();
    }
    let during = driver.block_on(check.check());
    let busy_pct = during
        .observed_value
        .as_ref()
        .and_then(|v| v.as_f64())
        .unwrap();
    assert!(
        busy_pct > 50.0,
        "a spinning runtime must read busy: {}",
        output(&during)
    );

    std::thread::sleep(Duration::from_millis(600));
    let idle = driver.block_on(check.check());
    let idle_pct = idle
        .observed_value
        .as_ref()
        .and_then(|v| v.as_f64())
        .unwrap();
    assert!(
        idle_pct < 50.0,
        "an idle runtime must read idle: {}",
        output(&idle)
    );
    assert_eq!(idle.status, Status::Pass);
}

// === ProcessAlive ===

struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn process_alive_follows_a_pid_file() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("agent.pid");
    let mut child = Reaped(Command::new("sleep").arg("60").spawn().unwrap());
    std::fs::File::create(&pid_file)
        .unwrap()
        .write_all(format!("{}\n", child.0.id()).as_bytes())
        .unwrap();
    let check = ProcessAlive::pid_file(&pid_file);
    let alive = check.check().await;
    assert_eq!(alive.status, Status::Pass, "{}", output(&alive));

    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let dead = check.check().await;
    assert_eq!(
        dead.status,
        Status::Fail,
        "a killed process must fail: {}",
        output(&dead)
    );
    assert!(output(&dead).contains("not running"), "{}", output(&dead));

    std::fs::write(&pid_file, "garbage").unwrap();
    let garbage = check.check().await;
    assert_eq!(garbage.status, Status::Fail);
    assert!(
        output(&garbage).contains("not a pid"),
        "{}",
        output(&garbage)
    );

    let missing = ProcessAlive::pid_file(dir.path().join("none.pid"))
        .check()
        .await;
    assert_eq!(missing.status, Status::Fail);
}

#[tokio::test]
async fn process_alive_finds_a_process_by_name() {
    let dir = tempfile::tempdir().unwrap();
    // A uniquely named copy of sleep, so no other process on the machine matches.
    let name = format!("vgl{}", std::process::id());
    let exe = dir.path().join(&name);
    std::fs::copy("/bin/sleep", &exe).unwrap();
    let check = ProcessAlive::name(&name);
    let none = check.check().await;
    assert_eq!(none.status, Status::Fail, "{}", output(&none));

    let mut child = Reaped(Command::new(&exe).arg("60").spawn().unwrap());
    let found = poll_until(|| async {
        let o = check.check().await;
        (o.status == Status::Pass).then_some(o)
    })
    .await
    .expect("the running process must be found by name");
    assert_eq!(found.observed_value, Some(1.into()), "{}", output(&found));

    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let gone = check.check().await;
    assert_eq!(gone.status, Status::Fail, "{}", output(&gone));
}

/// Polls `f` every 20 ms until it yields a value, for at most 10 s.
async fn poll_until<T, F, Fut>(mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(v) = f().await {
            return Some(v);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturation_follows_the_shed_layer_in_flight_count() {
    let health = vigil::Health::builder().start();
    let layer = health.shed_layer(2);
    let check = Saturation::shed(layer.stats());
    let release = Arc::new(tokio::sync::Notify::new());
    let app = {
        let release = release.clone();
        axum::Router::new()
            .route(
                "/work",
                axum::routing::get(move || {
                    let release = release.clone();
                    async move {
                        release.notified().await;
                        "done"
                    }
                }),
            )
            .layer(layer)
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let client = reqwest::Client::new();
    let requests: Vec<_> = (0..2)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.get(format!("http://{addr}/work")).send().await })
        })
        .collect();
    let full = poll_until(|| async {
        let o = check.check().await;
        (o.status == Status::Fail).then_some(o)
    })
    .await
    .expect("2 of 2 shed-layer slots taken must fail the check");
    assert!(output(&full).contains("2 of 2"), "{}", output(&full));
    release.notify_waiters();
    for r in requests {
        assert_eq!(r.await.unwrap().unwrap().status(), 200);
    }
    assert_eq!(check.check().await.status, Status::Pass);
}
