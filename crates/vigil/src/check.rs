//! The `Check` trait: one thing a service can check about itself or a dependency.

use futures::future::BoxFuture;
use std::future::Future;
use vigil_core::{CheckResult, Status};

/// What a check saw. The registry adds the name, timing and criticality around it to
/// make a [`CheckResult`].
pub type Observation = CheckResult;

/// A health check: something that can be asked, asynchronously, how a component is.
///
/// A check reports what it saw (status, observed value and unit, output); it does not
/// time itself out, retry, or cache: the background checker runs it at its interval,
/// cuts it at its timeout and publishes the result.
pub trait Check: Send + Sync + 'static {
    /// Runs the check once.
    fn check(&self) -> impl Future<Output = Observation> + Send;

    /// The draft's `componentType` for this check (`system`, `datastore`, `component`).
    /// Defaults to `component`.
    fn component_type(&self) -> &str {
        "component"
    }
}

/// Object-safe form of [`Check`], so a registry can hold checks of different types.
pub trait DynCheck: Send + Sync + 'static {
    /// Runs the check once, boxed.
    fn check_boxed(&self) -> BoxFuture<'_, Observation>;
    /// See [`Check::component_type`].
    fn component_type(&self) -> &str;
}

impl<C: Check> DynCheck for C {
    fn check_boxed(&self) -> BoxFuture<'_, Observation> {
        Box::pin(Check::check(self))
    }
    fn component_type(&self) -> &str {
        Check::component_type(self)
    }
}

/// A check from an async closure: `FnCheck::new(|| async { Observation::new(Status::Pass) })`.
pub struct FnCheck<F> {
    f: F,
}

impl<F, Fut> FnCheck<F>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Observation> + Send,
{
    /// Wraps the closure.
    pub fn new(f: F) -> Self {
        FnCheck { f }
    }
}

impl<F, Fut> Check for FnCheck<F>
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Observation> + Send,
{
    fn check(&self) -> impl Future<Output = Observation> + Send {
        (self.f)()
    }
}

/// Shorthand for a passing observation.
pub fn pass() -> Observation {
    Observation::new(Status::Pass)
}
