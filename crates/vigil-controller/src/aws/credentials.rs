//! Region and credentials, found as the AWS CLI and SDKs find them, for the parts of
//! their chain that a controller on a server needs without an SDK:
//!
//! 1. Environment: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`;
//!    `AWS_REGION`, then `AWS_DEFAULT_REGION`.
//! 2. The shared files of the profile (`[aws] profile`, else `AWS_PROFILE`, else
//!    `default`): the credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else
//!    `~/.aws/credentials`, sections `[NAME]`) and the config file (`AWS_CONFIG_FILE`,
//!    else `~/.aws/config`, sections `[profile NAME]` and `[default]`). Static keys
//!    only (`aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`); the
//!    credentials file wins over the config file, as in the SDKs.
//!
//! Not supported, and named in the error when a profile asks for it: assumed roles
//! (`role_arn`, `source_profile`), `credential_process`, SSO (`sso_*`), web identity
//! (`web_identity_token_file`, `AWS_WEB_IDENTITY_TOKEN_FILE`), ECS container
//! credentials (`AWS_CONTAINER_CREDENTIALS_*`) and EC2 instance roles (IMDS). Run the
//! controller with static keys (env or files) refreshed by whatever tool fetches them.
//!
//! Credentials are read again for every call (a few small file reads, for actions that
//! are rare and discovery polls seconds apart): keys rotated into the files are used
//! at the next call without a restart.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Keys a profile may hold that vigil does not act on, with what they would mean.
const UNSUPPORTED: [(&str, &str); 6] = [
    ("role_arn", "assumed roles"),
    ("credential_process", "credential processes"),
    ("sso_session", "SSO"),
    ("sso_start_url", "SSO"),
    ("web_identity_token_file", "web identity"),
    ("credential_source", "assumed roles"),
];

/// Static credentials and where they came from.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// `aws_access_key_id`.
    pub access_key_id: String,
    /// `aws_secret_access_key`.
    pub secret_access_key: String,
    /// `aws_session_token`, for temporary credentials.
    pub session_token: Option<String>,
    /// Where they were found (shown in errors and logs; never the secret).
    pub from: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The profile in force: the config's, else `AWS_PROFILE`, else `default`.
pub fn profile_name(configured: Option<&str>) -> String {
    configured
        .map(str::to_string)
        .or_else(|| env("AWS_PROFILE"))
        .unwrap_or_else(|| "default".to_string())
}

fn home_file(var: &str, rel: &str) -> Option<PathBuf> {
    env(var)
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(rel)))
}

/// The shared config file's path.
pub fn config_file() -> Option<PathBuf> {
    home_file("AWS_CONFIG_FILE", ".aws/config")
}

/// The shared credentials file's path.
pub fn credentials_file() -> Option<PathBuf> {
    home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials")
}

/// Parses an AWS shared file (INI): `[section]` headers, `key = value` lines, `#` and
/// `;` comment lines. Indented lines (a nested sub-section such as `s3 =`'s) are
/// skipped. Section names are kept as written; keys are lower-cased.
pub fn parse_ini(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut sections: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line.starts_with([' ', '\t']) {
            continue;
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
            sections.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        if let (Some(section), Some((k, v))) = (&current, line.split_once('=')) {
            sections
                .get_mut(section)
                .expect("the current section was inserted")
                .insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    sections
}

/// The profile's keys from the config file (`[profile NAME]`, or `[default]` for
/// `default`) and the credentials file (`[NAME]`), the latter winning.
fn profile_keys(
    profile: &str,
    config: Option<&str>,
    credentials: Option<&str>,
) -> Option<BTreeMap<String, String>> {
    let mut found = None::<BTreeMap<String, String>>;
    if let Some(text) = config {
        let ini = parse_ini(text);
        let named = ini.get(&format!("profile {profile}"));
        let keys = if profile == "default" {
            named.or_else(|| ini.get("default"))
        } else {
            named
        };
        if let Some(k) = keys {
            found = Some(k.clone());
        }
    }
    if let Some(text) = credentials
        && let Some(k) = parse_ini(text).get(profile)
    {
        found.get_or_insert_with(BTreeMap::new).extend(k.clone());
    }
    found
}

/// The region from the environment or the profile's `region` (the config's `region`
/// is checked by the caller first).
pub fn region_from_environment(profile: Option<&str>) -> Option<String> {
    if let Some(r) = env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")) {
        return Some(r);
    }
    let text = config_file().and_then(|p| std::fs::read_to_string(p).ok());
    profile_keys(&profile_name(profile), text.as_deref(), None)?
        .remove("region")
        .filter(|r| !r.is_empty())
}

/// Finds credentials: the environment first, then the profile in the shared files.
/// The error says what was looked at and what is not supported.
pub fn resolve(profile: Option<&str>) -> Result<Credentials, String> {
    match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        (Some(id), Some(secret)) => {
            return Ok(Credentials {
                access_key_id: id,
                secret_access_key: secret,
                session_token: env("AWS_SESSION_TOKEN"),
                from: "environment".into(),
            });
        }
        (Some(_), None) => {
            return Err("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not".into());
        }
        (None, Some(_)) => {
            return Err("AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not".into());
        }
        (None, None) => {}
    }
    let name = profile_name(profile);
    let (cfg_path, cred_path) = (config_file(), credentials_file());
    let read = |p: &Option<PathBuf>| p.as_ref().and_then(|p| std::fs::read_to_string(p).ok());
    let (cfg_text, cred_text) = (read(&cfg_path), read(&cred_path));
    let files = [&cred_path, &cfg_path]
        .iter()
        .filter_map(|p| p.as_ref().map(|p| p.display().to_string()))
        .collect::<Vec<_>>()
        .join(" and ");
    let keys = profile_keys(&name, cfg_text.as_deref(), cred_text.as_deref());
    let unsupported_env = [
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    ]
    .into_iter()
    .filter(|v| env(v).is_some())
    .collect::<Vec<_>>();
    let not_supported = if unsupported_env.is_empty() {
        String::new()
    } else {
        format!(
            " ({} is set, but vigil does not read web identity or container credentials)",
            unsupported_env.join(", ")
        )
    };
    let Some(keys) = keys else {
        return Err(format!(
            "no AWS credentials: AWS_ACCESS_KEY_ID is not set and profile {name:?} is not in {files}{not_supported}; vigil reads static keys only (no instance role, SSO, assumed role or credential_process)"
        ));
    };
    match (
        keys.get("aws_access_key_id").filter(|v| !v.is_empty()),
        keys.get("aws_secret_access_key").filter(|v| !v.is_empty()),
    ) {
        (Some(id), Some(secret)) => Ok(Credentials {
            access_key_id: id.clone(),
            secret_access_key: secret.clone(),
            session_token: keys
                .get("aws_session_token")
                .filter(|v| !v.is_empty())
                .cloned(),
            from: format!("profile {name:?} of {files}"),
        }),
        _ => {
            if let Some((key, what)) = UNSUPPORTED.iter().find(|(k, _)| keys.contains_key(*k)) {
                return Err(format!(
                    "profile {name:?} uses `{key}` ({what}), which vigil does not support: give the profile static keys (aws_access_key_id, aws_secret_access_key)"
                ));
            }
            Err(format!(
                "profile {name:?} in {files} has no aws_access_key_id and aws_secret_access_key{not_supported}"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ini_sections_keys_comments_and_nested_lines() {
        let ini = parse_ini(
            "# c\n[default]\nregion = eu-west-1\ns3 =\n  max_concurrent_requests = 2\n; c\n[profile  ops ]\nAWS_ACCESS_KEY_ID=AKIA\n",
        );
        assert_eq!(ini["default"]["region"], "eu-west-1");
        assert!(!ini["default"].contains_key("max_concurrent_requests"));
        assert_eq!(ini["profile ops"]["aws_access_key_id"], "AKIA");
    }

    #[test]
    fn the_credentials_file_wins_over_the_config_file() {
        let cfg = "[profile ops]\naws_access_key_id = FROMCONFIG\nregion = us-east-2\n[default]\nregion = eu-west-1\n";
        let cred = "[ops]\naws_access_key_id = FROMCREDS\naws_secret_access_key = s\n";
        let k = profile_keys("ops", Some(cfg), Some(cred)).unwrap();
        assert_eq!(k["aws_access_key_id"], "FROMCREDS");
        assert_eq!(k["region"], "us-east-2");
        assert_eq!(
            profile_keys("default", Some(cfg), None).unwrap()["region"],
            "eu-west-1"
        );
        assert!(profile_keys("nope", Some(cfg), Some(cred)).is_none());
    }
}
