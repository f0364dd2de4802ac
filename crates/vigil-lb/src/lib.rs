//! vigil lb: an HTTP load balancer that ejects failed servers fast and fails open.
//!
//! The policies (rise/fall thresholds, outlier ejection, fail-open, slow start, P2C,
//! retry budget) are vigil-core's sans-IO state machines; this crate drives them with
//! real I/O (tokio; hyper for the admin listener and the health checks).
//!
//! ## Floors
//!
//! The modules stand on floors, and a module imports only from floors below its own
//! (a child module, such as [`downstream::http2`], also from its parent). The test
//! `tests::every_import_goes_down_a_floor` reads these sources and fails on an import
//! of the same floor or one above, and on a module that is not given a floor here.
//!
//! | floor | modules | what they own |
//! |---|---|---|
//! | 1 command | [`cli`] | `vigil lb` and `vigil lb check-config` |
//! | 2 daemon | [`daemon`] | listeners, worker threads and the accept loop, the tick loop, reload on SIGHUP, drain on SIGTERM |
//! | 3 downstream | [`downstream`] (with [`downstream::http2`]), [`admin`], [`tls`] | the client side: a lean HTTP/1.1 server and HTTP/2 from clients; the admin listener (`/admin/targets`, `/metrics`); TLS termination, certificates by SNI |
//! | 4 proxy | [`proxy`], [`tunnel`], [`checker`] | the data path (pick, forward, retry, hedge, answer); upgrades joined byte for byte after a `101`; active health checks |
//! | 5 pool | [`pool`], [`share`] | a pool at run time: policy state, lock-free routing snapshots, events logged with their cause; shared probe verdicts between balancers (`[share]`, `/admin/verdicts`) |
//! | 6 upstream | [`upstream`] (with [`upstream::http2`], [`upstream::tls`]) | pooled connections to targets, HTTP/1.1 and HTTP/2, in cleartext or TLS; the one dial every connection to a target is made with |
//! | 7 shared | [`http_util`], [`body`], [`worker`], [`spare`], [`park`], [`config`], [`metrics`], [`access_log`] | hop-by-hop fields, [`http_util::AttemptFailure`], [`http_util::ErrorChain`]; the client stream and request body; a worker's CPU sharing; idle connections' buffers and their park; `lb.toml`; Prometheus metrics; access logs written off the data path |

pub mod access_log;
pub mod admin;
pub mod body;
pub mod checker;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod downstream;
pub mod http_util;
pub mod metrics;
pub mod park;
pub mod pool;
pub mod proxy;
pub mod share;
pub mod spare;
pub mod tls;
pub mod tunnel;
pub mod upstream;
pub mod worker;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    /// Each module's floor (the table in the crate doc): 1 is the top.
    const FLOORS: &[(&str, u8)] = &[
        ("cli", 1),
        ("daemon", 2),
        ("downstream", 3),
        ("admin", 3),
        ("tls", 3),
        ("proxy", 4),
        ("tunnel", 4),
        ("checker", 4),
        ("pool", 5),
        ("share", 5),
        ("upstream", 6),
        ("http_util", 7),
        ("body", 7),
        ("worker", 7),
        ("spare", 7),
        ("park", 7),
        ("config", 7),
        ("metrics", 7),
        ("access_log", 7),
    ];

    /// The modules of this crate that `code` names with a `crate::` path (`crate::a::b`,
    /// `crate::{a, b::c}`).
    fn imports(code: &str) -> Vec<String> {
        fn ident(s: &str) -> &str {
            let end = s
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(s.len());
            &s[..end]
        }
        let mut found = Vec::new();
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                // Top-level items of the group: split at commas outside nested braces.
                let (mut depth, mut start) = (0usize, 0usize);
                for (k, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            found.push(ident(group[start..k].trim()).to_string());
                            break;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            found.push(ident(group[start..k].trim()).to_string());
                            start = k + 1;
                        }
                        _ => {}
                    }
                }
            } else {
                found.push(ident(rest).to_string());
            }
        }
        found.retain(|m| !m.is_empty());
        found
    }

    /// `code` without its `//` comments (doc links name modules of any floor).
    fn without_comments(code: &str) -> String {
        code.lines()
            .map(|l| l.find("//").map_or(l, |i| &l[..i]))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every `.rs` file under `dir`, with the top-level module it belongs to.
    fn sources(dir: &Path, module: Option<&str>, out: &mut Vec<(String, std::path::PathBuf)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a readable directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("a UTF-8 file name")
                .to_string();
            let owner = module.map_or(stem.clone(), str::to_string);
            if path.is_dir() {
                sources(&path, Some(&owner), out);
            } else if path.extension().is_some_and(|e| e == "rs") && stem != "lib" {
                out.push((owner, path));
            }
        }
    }

    #[test]
    fn every_import_goes_down_a_floor() {
        let floors: BTreeMap<&str, u8> = FLOORS.iter().copied().collect();
        let mut files = Vec::new();
        sources(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            None,
            &mut files,
        );
        let mut seen = Vec::new();
        let mut wrong = Vec::new();
        for (module, path) in &files {
            let floor = *floors.get(module.as_str()).unwrap_or_else(|| {
                panic!(
                    "{}: module `{module}` has no floor: add it to FLOORS and the crate doc",
                    path.display()
                )
            });
            seen.push(module.clone());
            let code =
                std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for (line, text) in without_comments(&code).lines().enumerate() {
                for to in imports(text) {
                    if to == *module {
                        continue;
                    }
                    let Some(&to_floor) = floors.get(to.as_str()) else {
                        panic!(
                            "{}:{}: `crate::{to}` is not a module with a floor",
                            path.display(),
                            line + 1
                        );
                    };
                    if to_floor <= floor {
                        wrong.push(format!(
                            "{}:{}: {module} (floor {floor}) imports crate::{to} (floor {to_floor})",
                            path.display(),
                            line + 1
                        ));
                    }
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "imports must go down a floor:\n{}",
            wrong.join("\n")
        );
        for (module, _) in FLOORS {
            assert!(
                seen.iter().any(|m| m == module),
                "FLOORS names `{module}`, which has no file"
            );
        }
    }

    #[test]
    fn imports_are_found_in_paths_and_groups() {
        assert_eq!(imports("use crate::pool::PoolRt;"), ["pool"]);
        assert_eq!(
            imports("use crate::{body::{A, B}, http};  x: crate::proxy::P"),
            ["body", "http", "proxy"]
        );
        assert_eq!(
            imports(&without_comments("a // crate::daemon")),
            Vec::<String>::new()
        );
    }
}
