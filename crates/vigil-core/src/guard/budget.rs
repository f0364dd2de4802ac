//! The action budget: a token bucket whose every token returns `per` after it was spent.
//!
//! A classic constant-rate bucket ("2 per 10 minutes" refilling one token every 5
//! minutes) lets up to twice its capacity through in one window: a full bucket, then
//! the refills. The controller promises operators something simpler, so here each spent
//! token comes back exactly `per` after it was spent: **no window of length `per` ever
//! holds more than `actions` actions**, however the actions are spread, and a restart
//! (the state is persisted) resets nothing.

use crate::invalid::Invalid;
use crate::time::Time;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::time::Duration;

/// Default number of actions per window: 2. Two replacements cover the common case
/// (one bad host, maybe a second) while a bug that marks every host bad costs two hosts
/// per window, not the fleet.
pub const DEFAULT_BUDGET_ACTIONS: u32 = 2;
/// Default window: 10 minutes, about the time a replacement takes to boot and pass its
/// own grace period, so the next action sees whether the last one helped.
pub const DEFAULT_BUDGET_PER: Duration = Duration::from_secs(600);

/// How many actions per window the guard may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetConfig {
    /// Actions allowed in any window of length `per` (0 = never act). Defaults to 2.
    pub actions: u32,
    /// The window length, e.g. `"10m"`. Defaults to 10 minutes.
    #[serde(with = "humantime_serde")]
    pub per: Duration,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            actions: DEFAULT_BUDGET_ACTIONS,
            per: DEFAULT_BUDGET_PER,
        }
    }
}

impl BudgetConfig {
    /// Checks the values; the error names the bad key.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.per.is_zero() {
            return Err(Invalid::new("per", "must be longer than 0s"));
        }
        Ok(())
    }
}

/// The bucket's state: when each token still out was spent (oldest first).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    spent: VecDeque<Time>,
}

impl Budget {
    /// Tokens left at `now`.
    pub fn left(&self, config: &BudgetConfig, now: Time) -> u32 {
        let out = self.live(config, now).count();
        config
            .actions
            .saturating_sub(u32::try_from(out).unwrap_or(u32::MAX))
    }

    /// When the next token comes back, if none is left at `now` (None when one is left,
    /// or when `actions` is 0 and none ever will).
    pub fn next_token_at(&self, config: &BudgetConfig, now: Time) -> Option<Time> {
        if self.left(config, now) > 0 {
            return None;
        }
        // With `actions` tokens out (or more, after a reconfiguration shrank the bucket),
        // a token is free once all but `actions - 1` of them have returned.
        let out: Vec<Time> = self.live(config, now).collect();
        let must_return = out.len().checked_sub(config.actions as usize)?;
        out.get(must_return).map(|&t| t + config.per)
    }

    /// Spends a token if one is left. Returns true when it did (the caller may act).
    pub fn try_spend(&mut self, config: &BudgetConfig, now: Time) -> bool {
        while let Some(front) = self.spent.front() {
            if *front + config.per <= now {
                self.spent.pop_front();
            } else {
                break;
            }
        }
        if self.spent.len() < config.actions as usize {
            self.spent.push_back(now);
            true
        } else {
            false
        }
    }

    /// Times of the tokens spent within `per` before `now`, oldest first.
    fn live<'a>(&'a self, config: &'a BudgetConfig, now: Time) -> impl Iterator<Item = Time> + 'a {
        self.spent
            .iter()
            .copied()
            .filter(move |&t| t + config.per > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(actions: u32, per_s: u64) -> BudgetConfig {
        BudgetConfig {
            actions,
            per: Duration::from_secs(per_s),
        }
    }

    #[test]
    fn each_token_returns_one_window_after_it_was_spent() {
        let c = cfg(2, 600);
        let mut b = Budget::default();
        assert!(b.try_spend(&c, Time::from_secs(0)));
        assert!(b.try_spend(&c, Time::from_secs(100)));
        assert!(!b.try_spend(&c, Time::from_secs(599)), "bucket is empty");
        assert_eq!(b.left(&c, Time::from_secs(599)), 0);
        assert_eq!(
            b.next_token_at(&c, Time::from_secs(599)),
            Some(Time::from_secs(600))
        );
        assert!(b.try_spend(&c, Time::from_secs(600)), "first token is back");
        assert!(!b.try_spend(&c, Time::from_secs(650)));
        assert_eq!(b.left(&c, Time::from_secs(700)), 1);
    }

    #[test]
    fn zero_actions_never_allows_and_never_promises_a_token() {
        let c = cfg(0, 60);
        let mut b = Budget::default();
        assert!(!b.try_spend(&c, Time::from_secs(1)));
        assert_eq!(b.next_token_at(&c, Time::from_secs(1)), None);
    }

    #[test]
    fn a_zero_window_is_rejected() {
        assert!(cfg(1, 0).validate().unwrap_err().key == "per");
    }
}
