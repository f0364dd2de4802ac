//! The dashboard: one server-rendered page (maud), no build step, no external assets.
//!
//! `/` renders the whole page; a few lines of inline script fetch `/dashboard/live`
//! (the same markup, only the live part) every 2 seconds and swap it in, so the page
//! refreshes itself without reloading or flickering. Without script it still shows
//! the state as of loading.
//!
//! Laid out for an operator woken at 3 a.m., top to bottom: a red banner when the
//! store fails (nothing is acted on then); the guard (armed or frozen, and why, said
//! once); a legend with the count of targets in each state; the targets that need
//! attention, most severe first (then by zone and id), each tile saying what fails
//! and any operator hold in words, not only in a tooltip; the recent actions (what was
//! replaced, when, with what result); the recent decisions, whose freeze reasons point
//! to the guard instead of repeating its sentence on every row; then every other
//! target, compact, by zone. The order of severity and the legend's words come from
//! [`vigil_core::fleet::Standing`]. Below the actions, the `vigil deploy` rollouts in the store
//! ([`rollouts`]): waves, hosts and their steps, verdicts and why.

pub mod rollouts;

use crate::clock::rfc3339_ms;
use crate::store::{ActionRecord, DecisionRecord};
use crate::view::{FleetView, TargetInfo};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use std::collections::BTreeMap;
use vigil_core::fleet::Standing;
use vigil_core::guard::Reason;

/// Decisions listed (the API has the whole log).
pub const RECENT_DECISIONS: usize = 20;
/// Actions listed (the API has them all).
pub const RECENT_ACTIONS: usize = 10;

/// What the dashboard reads from the store besides the published view.
pub struct Recent {
    /// The latest decisions, newest first.
    pub decisions: Vec<DecisionRecord>,
    /// The latest actions, newest first.
    pub actions: Vec<ActionRecord>,
    /// The balancers' pools as last read (`[dashboard] balancers`).
    pub balancers: std::sync::Arc<Vec<crate::balancers::BalancerView>>,
    /// The actuator only logs (`log`): nothing is replaced.
    pub dry_run: bool,
    /// The latest `vigil deploy` rollouts, newest first.
    pub rollouts: Vec<crate::store::StoredRollout>,
}

const STYLE: &str = r#"
body { font: 14px/1.4 system-ui, sans-serif; margin: 1em 1.5em; color: #222; background: #fafafa; }
h1 { font-size: 1.3em; margin: 0 0 .4em; } h2 { font-size: 1.05em; margin: 1em 0 .3em; }
h2 small { font-weight: normal; color: #555; }
#status { color: #777; font-size: .75em; font-weight: normal; margin-left: 1em; }
.banner { background: #b71c1c; color: #fff; padding: .6em 1em; border-radius: 6px; margin-bottom: .8em; font-size: 1.1em; }
.guard { padding: .5em 1em; border-radius: 6px; margin-bottom: .6em; }
.guard.ok { background: #e6f4ea; border: 1px solid #9bd3a8; }
.guard.frozen { background: #fdecea; border: 2px solid #e57373; }
#legend { display: grid; grid-template-columns: repeat(auto-fill, minmax(300px, 1fr)); gap: 2px 12px; font-size: .8em; color: #444; margin-bottom: .4em; }
#legend .sw { display: inline-block; width: .9em; height: .9em; border-radius: 2px; vertical-align: -1px; margin-right: .3em; }
#legend .n { font-weight: 700; color: #222; min-width: 2.5em; display: inline-block; text-align: right; margin-right: .3em; }
#legend .zero { opacity: .55; }
.grid { display: flex; flex-wrap: wrap; gap: 4px; }
.tile { border-radius: 4px; color: #fff; }
.tile.big { width: 212px; padding: 4px 8px; font-size: .82em; }
.tile.small { width: 92px; padding: 1px 5px; font-size: .72em; }
.tile .id { font-weight: 600; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.tile .hold, .tile .zone { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.tile .why { display: -webkit-box; -webkit-line-clamp: 2; -webkit-box-orient: vertical; overflow: hidden; overflow-wrap: anywhere; }
td.t { white-space: nowrap; }
.tile .hold { font-style: italic; }
.state-healthy { background: #2e7d32; } .state-failing { background: #f9a825; color: #222; }
.state-unhealthy { background: #c62828; } .state-reported { background: #6a1b9a; }
.state-flapping { background: #ef6c00; } .state-grace, .state-unknown { background: #90a4ae; }
.state-silenced { background: #546e7a; } .state-maintenance { background: #1565c0; }
table { border-collapse: collapse; width: 100%; font-size: .82em; }
td, th { text-align: left; padding: 2px 6px; border-bottom: 1px solid #ddd; vertical-align: top; }
.act { color: #6a1b9a; font-weight: 600; } .hold_back { color: #555; }
.done { color: #2e7d32; font-weight: 600; } .failed { color: #c62828; font-weight: 600; } .intended { color: #ef6c00; font-weight: 600; }
.frozen-ref { color: #c62828; }
.calm { color: #555; }
.rollout { border: 1px solid #ddd; border-radius: 6px; padding: .4em .8em; margin-bottom: .6em; background: #fff; }
.rollout-head { padding: .2em .4em; border-radius: 4px; margin-bottom: .3em; }
.rollout-head.ok { background: #e6f4ea; } .rollout-head.moving { background: #e3f2fd; }
.rollout-head.warn { background: #fff3e0; } .rollout-head.bad { background: #fdecea; }
.rollout-head .phase { font-weight: 600; }
table.waves { width: auto; min-width: 50%; margin: .3em 0; }
ul.verdicts { margin: .3em 0; padding-left: 1.2em; font-size: .85em; }
ol.decisions { font-size: .8em; }
"#;

const SCRIPT: &str = r#"
(function () {
  var refreshed = 0;
  var status = document.getElementById('status');
  function refresh() {
    fetch('/dashboard/live', { cache: 'no-store' })
      .then(function (r) {
        if (r.status === 503) { throw new Error('busy'); }
        if (!r.ok) { throw new Error('HTTP ' + r.status); }
        return r.text();
      })
      .then(function (html) {
        document.getElementById('live').innerHTML = html;
        refreshed += 1;
        document.body.setAttribute('data-refreshed', String(refreshed));
        status.textContent = 'live, updated ' + new Date().toLocaleTimeString();
      })
      .catch(function (e) {
        status.textContent = e.message === 'busy' ? 'controller busy, retrying' : 'connection lost, retrying';
      });
  }
  setInterval(refresh, 2000);
  console.log('vigil dashboard live');
})();
"#;

/// The whole page.
pub fn page(fleet: &FleetView, recent: &Recent) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "vigil controller" }
                // An empty icon: no /favicon.ico request, no 404 in the console.
                link rel="icon" href="data:,";
                style { (PreEscaped(STYLE)) }
            }
            body data-refreshed="0" {
                h1 { "vigil controller" span #status { "loaded" } }
                div #live { (live(fleet, recent)) }
                script { (PreEscaped(SCRIPT)) }
            }
        }
    }
}

/// The live part (see the module docs for its order).
pub fn live(fleet: &FleetView, recent: &Recent) -> Markup {
    let mut attention: Vec<&TargetInfo> = Vec::new();
    let mut zones: BTreeMap<&str, (Vec<&TargetInfo>, usize)> = BTreeMap::new();
    for t in &fleet.targets {
        let zone = zones.entry(t.spec.zone.as_str()).or_default();
        if t.state.needs_attention() {
            attention.push(t);
            zone.1 += 1;
        } else {
            zone.0.push(t);
        }
    }
    attention.sort_by(|a, b| (a.state, &a.spec.zone, a.id()).cmp(&(b.state, &b.spec.zone, b.id())));
    html! {
        @if let Some(e) = &fleet.store_error {
            div #store-error .banner role="alert" {
                strong { "store failing: no actions are taken" } " (" (e) ")"
            }
        }
        (guard(fleet))
        @if recent.dry_run {
            div #dry-run .guard .ok {
                strong { "Dry run: " } "the actuator is " code { "log" }
                ": actions are decided and recorded, nothing is replaced "
                "(set " code { "[actuator] kind" } " to webhook or exec to act)."
            }
        }
        (balancers(&recent.balancers))
        (legend(fleet))
        section #attention {
            @if attention.is_empty() {
                h2 { "Needs attention: none" }
                @if !fleet.targets.is_empty() {
                    p .calm { "No target is failing or held." }
                }
            } @else {
                h2 { "Needs attention " small { "(" (attention.len()) ", most severe first, then by zone)" } }
                div .grid { @for t in &attention { (big_tile(t)) } }
            }
        }
        (actions(&recent.actions))
        (rollouts::rollouts(&recent.rollouts))
        (workers(&fleet.workers))
        (decisions(&recent.decisions))
        @for (zone, (calm, held)) in &zones {
            h2 { "Zone " (if zone.is_empty() { "(none)" } else { zone }) " "
                 small { "(" (calm.len() + held) " targets"
                     @if *held > 0 { ", " (held) " needing attention, above" } ")" } }
            div .grid { @for t in calm { (small_tile(t)) } }
        }
        @if fleet.targets.is_empty() { p { "No targets yet." } }
        @if !fleet.events.is_empty() {
            h2 { "Guard events" }
            ul #events {
                @for e in fleet.events.iter().rev() {
                    li { (rfc3339_ms(e.at_ms)) " " (e.message) }
                }
            }
        }
    }
}

/// The queue workers, each with its failure rate beside its group's: what the
/// controller's peer comparison (`vigil_core::anomaly`) sees, outliers first.
fn workers(verdicts: &[vigil_core::anomaly::MemberVerdict]) -> Markup {
    use vigil_core::anomaly::Finding;
    let pct = |r: f64| format!("{:.1}%", r * 100.0);
    let mut rows: Vec<&vigil_core::anomaly::MemberVerdict> = verdicts.iter().collect();
    rows.sort_by(|a, b| {
        (!a.is_outlier(), &a.cohort, &a.member).cmp(&(!b.is_outlier(), &b.cohort, &b.member))
    });
    html! {
        @if !rows.is_empty() {
            section #workers {
                h2 { "Queue workers " small { "(failure rate over the comparison window, beside their group's)" } }
                table {
                    tr { th { "worker" } th { "group" } th { "messages" } th { "failed" }
                         th { "its rate" } th { "group's rate" } th { "peers' pooled rate" } th { "verdict" } }
                    @for v in &rows {
                        @let group = vigil_core::anomaly::Counts::new(
                            v.counts.ok + v.peers.pooled.ok,
                            v.counts.failed + v.peers.pooled.failed,
                        );
                        tr .worker data-worker=(v.member) data-outlier=(v.is_outlier()) {
                            td { (v.member) }
                            td { (v.cohort) }
                            td { (v.counts.total()) }
                            td { (v.counts.failed) }
                            td .rate class=[v.is_outlier().then_some("failed")] { (pct(v.rate)) }
                            td .group-rate { (pct(group.rate())) }
                            td { (pct(v.peers.pooled_rate)) " of " (v.peers.count) " peers" }
                            td { (match &v.finding {
                                Finding::Outlier => "outlier: fails far more than its peers".to_string(),
                                Finding::LowVolume { min } => format!("too few messages (under {min})"),
                                Finding::TooFewPeers { peers, min } => format!("report only: {peers} peers, {min} needed"),
                                Finding::SharedFailure { failing, of } => format!("shared failure ({failing} of {of} fail together)"),
                                Finding::BelowFloor { .. } => "ok".to_string(),
                                Finding::NotWorse { .. } => "ok: not worse than its peers".to_string(),
                                Finding::NotSignificant => "ok: could be chance".to_string(),
                            }) }
                        }
                    }
                }
            }
        }
    }
}

/// The balancers' pools: what they route around, beside what the guard replaces.
fn balancers(views: &[crate::balancers::BalancerView]) -> Markup {
    html! {
        @if !views.is_empty() {
            section #balancers {
                h2 { "Balancers " small { "(what they route around; the guard above decides replacements)" } }
                table {
                    tr { th { "balancer" } th { "pool" } th { "in service" } th { "unhealthy" }
                         th { "ejected" } th { "not checked yet" } th { "drained" }
                         th { "client success" } th { "routing" } }
                    @for b in views {
                        @if let Some(e) = &b.error {
                            tr .unreadable { td { (b.url) } td colspan="8" { "cannot be read: " (e) } }
                        }
                        @for p in &b.pools {
                            tr data-pool=(p.name) data-fail-open=(p.fail_open)
                                data-success-rate=[p.success_rate] {
                                td { (b.url) } td { (p.name) }
                                td .n { (p.in_service) } td .n { (p.unhealthy) (named(&p.unhealthy_targets, p.unhealthy)) }
                                td .n { (p.ejected) (named(&p.ejected_targets, p.ejected)) } td .n { (p.unknown) } td .n { (p.drained) }
                                td .success {
                                    @match p.success_rate {
                                        Some(r) => { (format!("{:.1}%", r * 100.0)) " of " (p.answered) " answers, last " (p.window_seconds) " s" }
                                        None => { "no answers in the last minute" }
                                    }
                                }
                                td { @if let Some(r) = &p.fail_open_reason { strong { "FAIL-OPEN: " } (r) } @else { "healthy targets only" } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The targets a balancer's pool has out of service, named after their count (`of` in
/// all; the summary names at most [`crate::balancers::NAMED`]).
fn named(targets: &[String], of: usize) -> Markup {
    html! {
        @if !targets.is_empty() {
            small .names { ": " (targets.join(", "))
                @if of > targets.len() { " and " (of - targets.len()) " more" } }
        }
    }
}

fn guard(fleet: &FleetView) -> Markup {
    let g = &fleet.guard;
    let frozen = g.frozen || !g.frozen_zones.is_empty();
    html! {
        section #guard .guard .(if frozen { "frozen" } else { "ok" }) data-frozen=(frozen) {
            @if g.frozen {
                strong { "FROZEN: acting on no one." }
            } @else if frozen {
                strong { "Zones frozen: " (g.frozen_zones.join(", ")) }
            } @else {
                strong { "Guard armed: acting allowed within budget." }
            }
            @for r in &g.reasons { div .reason { (r) } }
            @for o in &g.shared_outages {
                div .shared-outage data-cohort=(o.cohort) data-paused=(o.paused) data-of=(o.of) {
                    strong { (o.summary) } "; since " (rfc3339_ms(o.since_ms)) "."
                    ul .paused-workers {
                        @for m in &o.members { li { strong { (m.id) } ": " (m.state) } }
                    }
                }
            }
            div {
                "Unhealthy " (g.unhealthy) "/" (g.total)
                " · budget " span #budget-left { (g.budget_left) } " of " (g.budget_actions)
                " per " (humantime::format_duration(g.budget_per))
                @if let Some(ms) = g.next_token_at_ms { " · next token at " (rfc3339_ms(ms)) }
            }
        }
    }
}

/// Each state's colour, count and meaning.
fn legend(fleet: &FleetView) -> Markup {
    html! {
        section #legend {
            @for s in Standing::ALL {
                @let n = fleet.count(s);
                div .entry .zero[n == 0] data-state=(s.name()) {
                    span .sw .{ "state-" (s.name()) } {}
                    span .n id={ "count-" (s.name()) } { (n) }
                    strong { (s.name()) } ": " (s.meaning())
                }
            }
        }
    }
}

fn big_tile(t: &TargetInfo) -> Markup {
    html! {
        div .tile .big .{ "state-" (t.state) } id={ "target-" (t.id()) } data-state=(t.state)
            title=(tile_title(t)) {
            div .id { (t.id()) }
            div .st { (t.state)
                @if t.consecutive_failures > 0 {
                    " · " (t.consecutive_failures) " failed "
                    @if t.consecutive_failures == 1 { "check" } @else { "checks in a row" } }
                @if !t.spec.zone.is_empty() { " · zone " span .zone { (t.spec.zone) } } }
            @if let Some(why) = t.failure() { div .why { "failing: " (why) } }
            @if let Some(h) = &t.hold {
                div .hold { (format!("{:?}", h.kind).to_lowercase()) ": " (h.reason)
                    @if let Some(ms) = h.until_ms { " (until " (rfc3339_ms(ms)) ")" } }
            }
        }
    }
}

fn small_tile(t: &TargetInfo) -> Markup {
    html! {
        div .tile .small .{ "state-" (t.state) } id={ "target-" (t.id()) } data-state=(t.state)
            title=(tile_title(t)) {
            div .id { (t.id()) }
        }
    }
}

fn actions(actions: &[ActionRecord]) -> Markup {
    html! {
        h2 { "Recent actions" }
        @if actions.is_empty() {
            p #no-actions .calm { "No action taken yet." }
        } @else {
            table #actions {
                tr { th { "when" } th { "what" } th { "result" } th { "attempts" } }
                @for a in actions {
                    tr data-target=(a.target) data-state=(serde_state(a)) {
                        td .t { (rfc3339_ms(a.created_ms)) }
                        td { (a.event["kind"].as_str().unwrap_or("act")) " " strong { (a.target) }
                            @if let Some(z) = a.event["zone"].as_str().filter(|z| !z.is_empty()) {
                                " (zone " (z) ")" } }
                        td { span .(serde_state(a)) { (serde_state(a)) }
                            @if let Some(r) = &a.result { ": " (r) }
                            @if let Some(ms) = a.finished_ms { " at " (rfc3339_ms(ms)) } }
                        td { (a.attempts) }
                    }
                }
            }
        }
    }
}

/// An action's state as the API spells it.
fn serde_state(a: &ActionRecord) -> String {
    serde_json::to_value(a.state)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

fn decisions(decisions: &[DecisionRecord]) -> Markup {
    html! {
        h2 { "Recent decisions" }
        @if decisions.is_empty() {
            p #no-decisions .calm { "No decisions yet: nothing has failed long enough to be judged." }
        } @else {
            table #decisions {
                tr { th { "time" } th { "target" } th { "outcome" } th { "reasons" } }
                @for d in decisions {
                    tr {
                        td .t { (rfc3339_ms(d.at_ms)) }
                        td { (d.target) }
                        td .(d.outcome) { (d.outcome.replace('_', " ")) }
                        td { (reasons(d)) }
                    }
                }
            }
        }
    }
}

/// A decision's reasons, a freeze said in a few words (the guard above says why in
/// full): the same sentence on every row held back by one freeze buries the rest.
fn reasons(d: &DecisionRecord) -> Markup {
    let Some(list) = d.reasons.as_array() else {
        return html! { (d.summary) };
    };
    html! {
        @for (i, r) in list.iter().enumerate() {
            @if i > 0 { "; " }
            @match short_freeze(r) {
                Some(s) => span .frozen-ref { (s) },
                None => @match serde_json::from_value::<Reason>(r.clone()) {
                    Ok(reason) => (reason.to_string()),
                    Err(_) => (r["kind"].as_str().unwrap_or("?").replace('_', " ")),
                },
            }
        }
    }
}

/// A freeze reason in a few words, or None if `r` is no freeze.
fn short_freeze(r: &serde_json::Value) -> Option<String> {
    let count = |r: &serde_json::Value| match (r["unhealthy"].as_u64(), r["total"].as_u64()) {
        (Some(u), Some(t)) => format!(" ({u}/{t} unhealthy)"),
        _ => String::new(),
    };
    match r["kind"].as_str()? {
        "fleet_frozen" => Some(format!("fleet frozen{}", count(r))),
        "zone_frozen" => Some(format!(
            "zone {} frozen{}",
            r["zone"].as_str().unwrap_or("?"),
            count(r)
        )),
        "manual_freeze" => Some("frozen by an operator".to_string()),
        _ => None,
    }
}

fn tile_title(t: &TargetInfo) -> String {
    let mut s = format!("{} ({})", t.id(), t.state);
    if !t.spec.url.is_empty() {
        s.push_str(&format!("\n{}", t.spec.url));
    }
    if let Some(p) = &t.last_probe
        && !p.detail.is_empty()
    {
        s.push_str(&format!("\n{}", p.detail));
    }
    if let Some(h) = &t.hold {
        s.push_str(&format!("\n{:?}: {}", h.kind, h.reason));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn recent(decisions: Vec<DecisionRecord>) -> Recent {
        Recent {
            decisions,
            actions: Vec::new(),
            balancers: Default::default(),
            dry_run: false,
            rollouts: Vec::new(),
        }
    }

    #[test]
    fn a_queue_worker_shows_its_failure_rate_beside_its_groups() {
        use vigil_core::anomaly::{Counts, Finding, MemberVerdict, Peers};
        let calm = live(&FleetView::empty(), &recent(Vec::new())).into_string();
        assert!(!calm.contains("id=\"workers\""), "no workers, no section");
        let verdict = |member: &str, counts: Counts, peers: Counts, finding| MemberVerdict {
            member: member.into(),
            cohort: "q".into(),
            rate: counts.rate(),
            counts,
            peers: Peers {
                count: 3,
                pooled: peers,
                pooled_rate: peers.rate(),
                median_rate: peers.rate(),
                max_rate: peers.rate(),
            },
            test: None,
            finding,
        };
        let fleet = FleetView {
            workers: vec![
                verdict(
                    "w0",
                    Counts::new(98, 2),
                    Counts::new(290, 10),
                    Finding::NotSignificant,
                ),
                verdict(
                    "w3",
                    Counts::new(0, 100),
                    Counts::new(294, 6),
                    Finding::Outlier,
                ),
            ],
            ..FleetView::empty()
        };
        let html = live(&fleet, &recent(Vec::new())).into_string();
        let w3 = html
            .find("data-worker=\"w3\"")
            .expect("the black hole is listed");
        let w0 = html.find("data-worker=\"w0\"").expect("its peer is listed");
        assert!(w3 < w0, "outliers first: {html}");
        let row = &html[w3..w0];
        assert!(row.contains("data-outlier=\"true\""), "{row}");
        assert!(row.contains("100.0%"), "its own rate: {row}");
        // The group's rate: 106 failed of 400, beside the peers' pooled 2.0%.
        assert!(
            row.contains("26.5%") && row.contains("2.0% of 3 peers"),
            "{row}"
        );
    }

    #[test]
    fn a_store_error_shows_the_red_banner_first() {
        let ok = live(&FleetView::empty(), &recent(Vec::new())).into_string();
        assert!(
            !ok.contains("store-error"),
            "no banner while the store works"
        );
        let failing = FleetView {
            store_error: Some("disk I/O error".into()),
            ..FleetView::empty()
        };
        let html = live(&failing, &recent(Vec::new())).into_string();
        let banner = html.find("store failing: no actions are taken");
        assert!(banner.is_some(), "{html}");
        assert!(html.contains("disk I/O error"), "the error is said");
        assert!(
            banner < html.find("id=\"guard\""),
            "the banner comes before anything else"
        );
    }

    #[test]
    fn a_decision_held_back_by_a_freeze_names_it_in_a_few_words() {
        let frozen = Reason::FleetFrozen {
            unhealthy: 7,
            total: 10,
            cap: 0.3,
            evidence: Default::default(),
        };
        let zone = Reason::ZoneFrozen {
            zone: "a".into(),
            unhealthy: 3,
            total: 4,
            cap: 0.3,
            evidence: Default::default(),
        };
        let failing = Reason::Failing {
            failures: 3,
            failing_for: Duration::from_secs(30),
            causes: Vec::new(),
        };
        let d = DecisionRecord {
            id: 1,
            at_ms: 0,
            target: "t1".into(),
            zone: "a".into(),
            outcome: "hold_back".into(),
            reasons: serde_json::to_value([&failing, &frozen, &zone]).unwrap(),
            summary: "hold back t1".into(),
        };
        let html = decisions(&[d]).into_string();
        assert!(html.contains("fleet frozen (7/10 unhealthy)"), "{html}");
        assert!(html.contains("zone a frozen (3/4 unhealthy)"), "{html}");
        assert!(html.contains(&failing.to_string()), "other reasons in full");
        assert!(!html.contains(&frozen.to_string()), "{html}");
        assert!(!html.contains(&zone.to_string()), "{html}");
    }
}
