//! Test doubles shared by the library's tests (protocols, HTTP, admission, workers).
#![allow(dead_code)] // each test binary uses its own subset

pub mod queue;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;
use vigil::{CheckOptions, CheckResult, FnCheck, HealthConfig, Status};

/// A check whose status the test sets.
#[derive(Clone, Default)]
pub struct Knob(Arc<AtomicU8>);

impl Knob {
    pub fn set(&self, s: Status) {
        self.0.store(s as u8, Ordering::SeqCst);
    }
    pub fn get(&self) -> Status {
        match self.0.load(Ordering::SeqCst) {
            0 => Status::Pass,
            1 => Status::Warn,
            _ => Status::Fail,
        }
    }
    pub fn check(
        &self,
    ) -> FnCheck<impl Fn() -> std::future::Ready<CheckResult> + Send + Sync + 'static> {
        let knob = self.0.clone();
        FnCheck::new(move || {
            let status = match knob.load(Ordering::SeqCst) {
                0 => Status::Pass,
                1 => Status::Warn,
                _ => Status::Fail,
            };
            std::future::ready(CheckResult::new(status).with_output("set by the test"))
        })
    }
}

pub fn fast() -> CheckOptions {
    CheckOptions::every(Duration::from_millis(50))
        .timeout(Duration::from_secs(1))
        .jitter(0.0)
}

/// Short periods so the watchdog acts within a test, generous enough for a loaded
/// 2-core machine (a heartbeat missed by 400 ms would be a real stall).
pub fn fast_config() -> HealthConfig {
    HealthConfig {
        heartbeat: Duration::from_millis(50),
        stale_after: Duration::from_millis(400),
        restart_backoff: Duration::from_millis(600),
        drain_delay: Duration::from_millis(400),
    }
}

/// A check every `ms` milliseconds, without jitter.
pub fn every(ms: u64) -> CheckOptions {
    CheckOptions::every(Duration::from_millis(ms)).jitter(0.0)
}
