//! What was built: the crate version and the git commit (baked in by `build.rs`:
//! `$VIGIL_BUILD_COMMIT`, else `git rev-parse`, else `unknown`). Shown by
//! `vigil --version` and exported as `vigil_build_info{version,commit}` by every
//! `/metrics` endpoint.

/// The workspace version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The source's git commit, 12 hex digits, or `unknown` when the build could not tell.
pub const COMMIT: &str = env!("VIGIL_COMMIT");

/// `VERSION (commit COMMIT)`, as `vigil --version` prints it.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("VIGIL_COMMIT"),
    ")"
);
