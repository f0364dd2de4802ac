//! `FileDescriptors` against a really lowered soft RLIMIT_NOFILE in this process.
//!
//! Alone in its file: lowering the limit affects every thread of the test binary.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use vigil::Check;
use vigil::Status;
use vigil::checks::FileDescriptors;

#[tokio::test(flavor = "current_thread")]
async fn file_descriptors_fail_near_the_soft_limit_and_recover_when_closed() {
    let check = FileDescriptors::new();
    let baseline = check.check().await;
    let open_now = baseline.observed_value.unwrap().as_u64().unwrap();

    // Room for 100 more descriptors under a lowered soft limit (the hard one stays).
    let original = getrlimit(Resource::Nofile);
    let soft = open_now + 100;
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(soft),
            maximum: original.maximum,
        },
    )
    .expect("lowering the soft limit is always allowed");

    let ok = check.check().await;
    assert_eq!(ok.status, Status::Pass, "{:?}", ok.output);

    // 85 more open: 85%+ of the limit, past the warn level.
    let mut files: Vec<std::fs::File> = (0..85)
        .map(|_| std::fs::File::open("/proc/self/stat").unwrap())
        .collect();
    let warn = check.check().await;
    assert_eq!(warn.status, Status::Warn, "{:?}", warn.output);

    // Then until open fails with EMFILE: nothing left at all.
    loop {
        match std::fs::File::open("/proc/self/stat") {
            Ok(f) => files.push(f),
            Err(e) => {
                assert_eq!(
                    e.raw_os_error(),
                    Some(rustix::io::Errno::MFILE.raw_os_error())
                );
                break;
            }
        }
    }
    let exhausted = check.check().await;
    assert_eq!(exhausted.status, Status::Fail);
    assert!(
        exhausted.output.as_deref().unwrap().contains("exhausted"),
        "the check must say why: {:?}",
        exhausted.output
    );

    files.clear();
    let recovered = check.check().await;
    assert_eq!(recovered.status, Status::Pass, "{:?}", recovered.output);
    setrlimit(Resource::Nofile, original).unwrap();
}
