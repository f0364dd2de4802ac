//! Bakes the source's git commit into `vigil_core::build::COMMIT` (env `VIGIL_COMMIT`),
//! for `vigil --version` and every `vigil_build_info` metric.
//!
//! In order: `$VIGIL_BUILD_COMMIT` (for packagers building from a tarball), `git
//! rev-parse` in a clone, the `sha1` cargo writes into `.cargo_vcs_info.json` of a
//! published package, else `unknown`. Never fails the build: a clean clone without git
//! installed still builds.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=VIGIL_BUILD_COMMIT");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = std::env::var("VIGIL_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| from_git(&dir))
        .or_else(|| from_vcs_info(&dir))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=VIGIL_COMMIT={}", commit.trim());
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

/// The commit of HEAD, asking cargo to run this again when HEAD or its branch moves.
fn from_git(dir: &Path) -> Option<String> {
    let commit = git(dir, &["rev-parse", "--short=12", "HEAD"])?;
    let mut watch = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watch.push(branch);
    }
    for name in watch {
        if let Some(p) = git(dir, &["rev-parse", "--git-path", &name]) {
            let p = dir.join(p);
            // A path that does not exist would make cargo rerun this at every build.
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    Some(commit)
}

/// `"sha1": "<40 hex>"` from the `.cargo_vcs_info.json` of a packaged crate.
fn from_vcs_info(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(".cargo_vcs_info.json")).ok()?;
    let rest = &text[text.find("\"sha1\"")? + 6..];
    let start = rest.find('"')? + 1;
    let sha: String = rest[start..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    (sha.len() >= 12).then(|| sha[..12].to_string())
}
