//! The dashboard: one server-rendered page (maud), no build step, no external assets.
//!
//! `/` renders the whole page; a few lines of inline script fetch `/dashboard/live`
//! (the same markup, only the live part) every 2 seconds and swap it in, so the page
//! refreshes itself without reloading or flickering. Without script it still shows
//! the state as of loading.

use crate::clock::rfc3339_ms;
use crate::engine::{FleetView, TargetInfo};
use crate::store::DecisionRecord;
use maud::{DOCTYPE, Markup, PreEscaped, html};
use std::collections::BTreeMap;

const STYLE: &str = r#"
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; background: #fafafa; }
h1 { font-size: 1.4em; margin: 0 0 .5em; } h2 { font-size: 1.1em; margin: 1.2em 0 .4em; }
#status { color: #777; font-size: .9em; margin-left: 1em; }
.guard { padding: .8em 1em; border-radius: 6px; margin-bottom: 1em; }
.guard.ok { background: #e6f4ea; border: 1px solid #9bd3a8; }
.guard.frozen { background: #fdecea; border: 2px solid #e57373; }
.grid { display: flex; flex-wrap: wrap; gap: 6px; }
.tile { width: 140px; padding: 6px 8px; border-radius: 4px; color: #fff; font-size: .85em; }
.tile .id { font-weight: 600; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.state-healthy { background: #2e7d32; } .state-failing { background: #f9a825; color: #222; }
.state-unhealthy { background: #c62828; } .state-reported { background: #6a1b9a; }
.state-flapping { background: #ef6c00; } .state-grace, .state-unknown { background: #90a4ae; }
.state-silenced { background: #546e7a; } .state-maintenance { background: #1565c0; }
table { border-collapse: collapse; width: 100%; font-size: .85em; }
td, th { text-align: left; padding: 3px 6px; border-bottom: 1px solid #ddd; vertical-align: top; }
.act { color: #6a1b9a; font-weight: 600; } .hold_back { color: #555; }
.store-failing { background: #c62828; color: #fff; padding: .8em 1em; border-radius: 6px; margin-bottom: 1em; }
"#;

const SCRIPT: &str = r#"
(function () {
  var refreshed = 0;
  var status = document.getElementById('status');
  function refresh() {
    fetch('/dashboard/live', { cache: 'no-store' })
      .then(function (r) { if (!r.ok) { throw new Error('HTTP ' + r.status); } return r.text(); })
      .then(function (html) {
        document.getElementById('live').innerHTML = html;
        refreshed += 1;
        document.body.setAttribute('data-refreshed', String(refreshed));
        status.textContent = 'live, updated ' + new Date().toLocaleTimeString();
      })
      .catch(function () { status.textContent = 'connection lost, retrying'; });
  }
  setInterval(refresh, 2000);
  console.log('vigil dashboard live');
})();
"#;

/// The whole page.
pub fn page(fleet: &FleetView, decisions: &[DecisionRecord]) -> Markup {
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
                div #live { (live(fleet, decisions)) }
                script { (PreEscaped(SCRIPT)) }
            }
        }
    }
}

/// The live part: guard, targets by zone, recent decisions and events.
pub fn live(fleet: &FleetView, decisions: &[DecisionRecord]) -> Markup {
    let g = &fleet.guard;
    let mut zones: BTreeMap<&str, Vec<&TargetInfo>> = BTreeMap::new();
    for t in &fleet.targets {
        zones.entry(t.zone.as_str()).or_default().push(t);
    }
    let frozen = g.frozen || !g.frozen_zones.is_empty();
    html! {
        @if let Some(e) = &fleet.store_error {
            section #store-failing .store-failing {
                strong { "store failing: no actions are taken" } " (" (e) ")"
            }
        }
        section #guard .guard .(if frozen { "frozen" } else { "ok" }) data-frozen=(frozen) {
            @if g.frozen {
                strong { "FROZEN: acting on no one." }
            } @else if frozen {
                strong { "Zones frozen: " (g.frozen_zones.join(", ")) }
            } @else {
                strong { "Guard armed: acting allowed within budget." }
            }
            @for r in &g.reasons { div .reason { (r) } }
            div {
                "Unhealthy " (g.unhealthy) "/" (g.total)
                " · budget " span #budget-left { (g.budget_left) } " of " (g.budget_actions)
                " per " (humantime::format_duration(g.budget_per))
                @if let Some(ms) = g.next_token_at_ms { " · next token at " (rfc3339_ms(ms)) }
            }
        }
        @for (zone, targets) in &zones {
            h2 { "Zone " (if zone.is_empty() { "(none)" } else { zone }) " "
                 small { "(" (targets.len()) " targets)" } }
            div .grid {
                @for t in targets {
                    div .tile .{ "state-" (t.state) } id={ "target-" (t.id) } data-state=(t.state)
                        title=(tile_title(t)) {
                        div .id { (t.id) }
                        div .st { (t.state)
                            @if t.consecutive_failures > 0 { " ×" (t.consecutive_failures) } }
                    }
                }
            }
        }
        @if fleet.targets.is_empty() { p { "No targets yet." } }
        h2 { "Recent decisions" }
        @if decisions.is_empty() {
            p #no-decisions { "No decisions yet: nothing has failed long enough to be judged." }
        } @else {
            table #decisions {
                tr { th { "time" } th { "target" } th { "outcome" } th { "reasons" } }
                @for d in decisions {
                    tr {
                        td { (rfc3339_ms(d.at_ms)) }
                        td { (d.target) }
                        td .(d.outcome) { (d.outcome.replace('_', " ")) }
                        td { (d.summary) }
                    }
                }
            }
        }
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

fn tile_title(t: &TargetInfo) -> String {
    let mut s = format!("{} ({})", t.id, t.state);
    if !t.url.is_empty() {
        s.push_str(&format!("\n{}", t.url));
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
