//! Why a policy's settings cannot be used: [`Invalid`], a typed error naming the key.
//!
//! Every `validate()` in vigil-core returns one. Its `key` is a path relative to the
//! settings struct that was validated (`outlier.max_ejection_percent`,
//! `targets[2].addr`); a driver that embeds the struct under its own key adds its
//! prefix with [`Invalid::within`], and one shared locator (the `vigil-config`
//! crate) finds that path in the TOML file to say file, line and column. Nobody parses
//! the key back out of a message.

use std::fmt;

/// A setting that cannot be used: which key, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// Dotted key path, with `[i]` for array elements: `health_check.interval`.
    pub key: String,
    /// What is wrong and what was expected (without the key): `must be at least 1`.
    pub message: String,
}

impl Invalid {
    /// An error about `key`.
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Invalid {
            key: key.into(),
            message: message.into(),
        }
    }

    /// The same error seen from the struct that holds this one under `parent`
    /// (`"outlier"`, `"pools.api"`, `"targets[3]"`).
    #[must_use]
    pub fn within(mut self, parent: &str) -> Self {
        if !parent.is_empty() {
            self.key = if self.key.is_empty() {
                parent.to_string()
            } else {
                format!("{parent}.{}", self.key)
            };
        }
        self
    }

    /// The same error with the key's leading `from` segment replaced by `to`, for a
    /// driver whose file nests a core setting under another name (the balancer's
    /// `health_check` holds the pool's `thresholds`).
    #[must_use]
    pub fn renamed(mut self, from: &str, to: &str) -> Self {
        if self.key == from {
            self.key = to.to_string();
        } else if let Some(rest) = self.key.strip_prefix(from)
            && rest.starts_with(['.', '['])
        {
            self.key = format!("{to}{rest}");
        }
        self
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

impl std::error::Error for Invalid {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_and_renamed_compose_the_key_path() {
        let e = Invalid::new("unhealthy_threshold", "must be at least 1")
            .within("thresholds")
            .renamed("thresholds", "health_check")
            .within("pools.api");
        assert_eq!(e.key, "pools.api.health_check.unhealthy_threshold");
        assert_eq!(
            e.to_string(),
            "pools.api.health_check.unhealthy_threshold: must be at least 1"
        );
        // Only a whole leading segment is renamed.
        let e = Invalid::new("thresholds_extra", "x").renamed("thresholds", "hc");
        assert_eq!(e.key, "thresholds_extra");
        let e = Invalid::new("targets[1].addr", "x").renamed("targets", "backends");
        assert_eq!(e.key, "backends[1].addr");
        assert_eq!(Invalid::new("", "x").within("a").key, "a");
    }
}
