//! The `Check` trait: one thing a service can check about itself or a dependency.

use futures::future::BoxFuture;
use std::future::Future;
use vigil_core::{CheckResult, Status};

/// The old name of [`CheckResult`], what a check returns (one type: the registry fills
/// in its name, timing and criticality). `vigil_core::guard::Observation` is the one
/// `Observation` of the workspace: one probe of one target, as the safety guard sees it.
#[deprecated(since = "0.1.0", note = "renamed to `CheckResult` (the same type)")]
pub type Observation = CheckResult;

/// A health check: something that can be asked, asynchronously, how a component is.
///
/// A check reports what it saw (status, observed value and unit, output); it does not
/// time itself out, retry, or cache: the background checker runs it at its interval,
/// cuts it at its timeout and publishes the result.
pub trait Check: Send + Sync + 'static {
    /// Runs the check once.
    fn check(&self) -> impl Future<Output = CheckResult> + Send;

    /// The draft's `componentType` for this check (`system`, `datastore`, `component`).
    /// Defaults to `component`.
    fn component_type(&self) -> &str {
        "component"
    }
}

/// Object-safe form of [`Check`], so a registry can hold checks of different types.
pub trait DynCheck: Send + Sync + 'static {
    /// Runs the check once, boxed.
    fn check_boxed(&self) -> BoxFuture<'_, CheckResult>;
    /// See [`Check::component_type`].
    fn component_type(&self) -> &str;
}

impl<C: Check> DynCheck for C {
    fn check_boxed(&self) -> BoxFuture<'_, CheckResult> {
        Box::pin(Check::check(self))
    }
    fn component_type(&self) -> &str {
        Check::component_type(self)
    }
}

/// A check from an async closure: `FnCheck::new(|| async { CheckResult::new(Status::Pass) })`.
pub struct FnCheck<F> {
    f: F,
}

impl<F, Fut> FnCheck<F>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = CheckResult> + Send,
{
    /// Wraps the closure.
    pub fn new(f: F) -> Self {
        FnCheck { f }
    }
}

impl<F, Fut> Check for FnCheck<F>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = CheckResult> + Send,
{
    fn check(&self) -> impl Future<Output = CheckResult> + Send {
        (self.f)()
    }
}

/// Shorthand for a passing observation.
pub fn pass() -> CheckResult {
    CheckResult::new(Status::Pass)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(deprecated)]
    fn the_old_name_observation_is_still_the_check_result() {
        let old: crate::Observation = CheckResult::fail("down");
        let new: CheckResult = old;
        assert_eq!(
            new.status,
            Status::Fail,
            "code written against `Observation` keeps compiling"
        );
    }
}
