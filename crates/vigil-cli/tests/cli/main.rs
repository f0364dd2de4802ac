//! The binary's own conventions: `--version` with the commit, shell completions and a
//! man page from the clap definitions, usage errors exiting 64 (never 2, `vigil check`'s
//! "fail"), and one rule for config paths (`-c` before or after the verb, the env
//! variable, the default file in the current directory) in `vigil lb` and
//! `vigil controller`.

use std::path::Path;
use std::process::{Command, Output};

fn vigil(args: &[&str], dir: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vigil"));
    cmd.args(args)
        .env_remove("VIGIL_LB_CONFIG")
        .env_remove("VIGIL_CONTROLLER_CONFIG");
    if let Some(d) = dir {
        cmd.current_dir(d);
    }
    cmd.output().expect("run vigil")
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn version_names_the_git_commit() {
    let o = vigil(&["--version"], None);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with(&format!("vigil {}", env!("CARGO_PKG_VERSION"))),
        "{out}"
    );
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match head {
        Some(commit) => assert!(
            out.contains(&format!("(commit {commit})")),
            "--version must name the commit {commit}: {out}"
        ),
        // Built outside a clone (or without git): it says so rather than failing.
        None => assert!(out.contains("(commit "), "{out}"),
    }
}

#[test]
fn completions_for_every_shell_and_a_man_page() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = vigil(&["completions", shell], None);
        assert_eq!(o.status.code(), Some(0), "{shell}: {}", text(&o));
        let script = String::from_utf8_lossy(&o.stdout);
        for word in ["vigil", "check-config", "controller", "log-format"] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
    }
    let o = vigil(&["man"], None);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let page = String::from_utf8_lossy(&o.stdout);
    assert!(
        page.starts_with(".ie") || page.contains(".TH vigil"),
        "roff: {page}"
    );
    for word in ["completions", "controller", "\\-\\-log\\-format"] {
        assert!(page.contains(word), "the man page lacks {word}");
    }
}

#[test]
fn usage_errors_exit_64_never_checks_fail_code() {
    for args in [
        &["--no-such-flag"][..],
        &[],
        &["check"],
        &["check", "http://127.0.0.1:1/", "--timeout", "soon"],
        &["lb", "--no-such-flag"],
        &["controller", "no-such-verb"],
        &["completions", "tcsh"],
        &["sim"],
    ] {
        let o = vigil(args, None);
        assert_eq!(o.status.code(), Some(64), "vigil {args:?}: {}", text(&o));
    }
    for args in [&["--help"][..], &["lb", "--help"], &["check", "--help"]] {
        assert_eq!(vigil(args, None).status.code(), Some(0), "vigil {args:?}");
    }
}

#[test]
fn config_path_rule_is_the_same_for_lb_and_controller() {
    for (verb, default, config, env) in [
        (
            "lb",
            "lb.toml",
            "[pools.api]\ntargets = [{ addr = \"127.0.0.1:1\" }]\n",
            "VIGIL_LB_CONFIG",
        ),
        (
            "controller",
            "fleet.toml",
            "[[targets]]\nid = \"a\"\nurl = \"http://127.0.0.1:1\"\n",
            "VIGIL_CONTROLLER_CONFIG",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("other.toml");
        std::fs::write(&file, config).unwrap();
        let f = file.to_str().unwrap();
        // -c after the verb, -c before it, --config.
        for args in [
            vec![verb, "check-config", "-c", f],
            vec![verb, "-c", f, "check-config"],
            vec![verb, "--config", f, "check-config"],
        ] {
            let o = vigil(&args, Some(dir.path()));
            assert_eq!(o.status.code(), Some(0), "vigil {args:?}: {}", text(&o));
        }
        // The environment variable.
        let o = Command::new(env!("CARGO_BIN_EXE_vigil"))
            .args([verb, "check-config"])
            .env(env, &file)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{env}: {}", text(&o));
        // The default file in the current directory: missing, then there.
        let o = vigil(&[verb, "check-config"], Some(dir.path()));
        assert_eq!(
            o.status.code(),
            Some(78),
            "{verb} without {default}: {}",
            text(&o)
        );
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(default),
            "the error names {default}: {}",
            text(&o)
        );
        std::fs::copy(&file, dir.path().join(default)).unwrap();
        let o = vigil(&[verb, "check-config"], Some(dir.path()));
        assert_eq!(
            o.status.code(),
            Some(0),
            "{verb} with {default}: {}",
            text(&o)
        );
    }
}

#[test]
fn the_example_worker_names_the_broker_it_cannot_reach() {
    // Port 1: nothing listens there.
    let o = vigil(
        &[
            "example-worker",
            "--amqp",
            "amqp://guest:guest@127.0.0.1:1/%2f",
            "--listen",
            "127.0.0.1:0",
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("cannot connect to RabbitMQ at amqp://guest:guest@127.0.0.1:1/%2f"),
        "{}",
        text(&o)
    );
}

#[path = "../lb_support/mod.rs"]
mod lb_support;

// The other files of this binary (one binary per component: a 2-core machine
// links a handful of test binaries, not one per file).
mod check;
mod config_reference;
mod example_grpc;
mod fuzz_replay;
mod logs;
mod metrics_promtool;
mod overload_service;
mod sim;
mod systemd;
