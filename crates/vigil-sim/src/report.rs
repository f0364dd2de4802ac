//! The self-contained HTML report: timeline charts as inline SVG, the summary side by
//! side, the expectations and the notable events. No script, no external asset: the file
//! can be mailed, attached to a ticket or opened offline.

use crate::Checked;
use crate::scenario::Scenario;
use crate::sim::{DecisionMark, Mark, RunOutcome, Sample};
use crate::summary::Summary;
use std::fmt::Write as _;

const VIGIL_COLOR: &str = "#1f6feb";
const NAIVE_COLOR: &str = "#d1242f";
const FAIL_OPEN_COLOR: &str = "#f0b429";
const FAULT_COLOR: &str = "#6e7781";
const W: f64 = 900.0;
const H: f64 = 220.0;
const PAD_L: f64 = 56.0;
const PAD_R: f64 = 16.0;
const PAD_T: f64 = 28.0;
const PAD_B: f64 = 30.0;

/// Escapes text for HTML.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

struct Line<'a> {
    label: &'a str,
    color: &'a str,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

struct Chart<'a> {
    title: &'a str,
    y_min: f64,
    y_max: f64,
    x_max: f64,
    y_fmt: &'a dyn Fn(f64) -> String,
    lines: Vec<Line<'a>>,
    shading: Vec<(f64, f64, &'a str)>,
    marks: &'a [Mark],
    decisions: &'a [DecisionMark],
}

/// Colour of a policy decision's marker.
fn decision_color(kind: &str) -> &'static str {
    match kind {
        "fail-open" | "fail-open-end" => FAIL_OPEN_COLOR,
        "freeze" | "unfreeze" => "#8250df",
        "alert" => NAIVE_COLOR,
        _ => FAULT_COLOR,
    }
}

fn fmt_time(secs: f64) -> String {
    if secs >= 3600.0 {
        format!("{:.1}h", secs / 3600.0)
    } else if secs >= 60.0 {
        format!("{:.0}m", secs / 60.0)
    } else {
        format!("{secs:.0}s")
    }
}

impl Chart<'_> {
    fn x(&self, t: f64) -> f64 {
        PAD_L + (W - PAD_L - PAD_R) * (t / self.x_max.max(1e-9))
    }
    fn y(&self, v: f64) -> f64 {
        let span = (self.y_max - self.y_min).max(1e-9);
        PAD_T + (H - PAD_T - PAD_B) * (1.0 - (v - self.y_min) / span)
    }

    fn svg(&self) -> String {
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg viewBox="0 0 {W} {H}" width="100%" role="img" aria-label="{t}" xmlns="http://www.w3.org/2000/svg">"#,
            t = esc(self.title)
        );
        let _ = write!(
            s,
            r#"<text x="{PAD_L}" y="16" class="title">{}</text>"#,
            esc(self.title)
        );
        // Faults: a light band over their duration (only when they have one: a kill or a
        // disk filling has no end to shade to) and a line at their start. Labels that
        // would overlap the previous one go one row down.
        let mut rows: Vec<f64> = Vec::new(); // per row: where its last label ends
        for m in self.marks {
            let x0 = self.x(m.start);
            if let Some(end) = m.end {
                let x1 = self.x(end.min(self.x_max));
                let _ = write!(
                    s,
                    r#"<rect x="{x0:.1}" y="{PAD_T}" width="{:.1}" height="{:.1}" fill="{FAULT_COLOR}" opacity="0.08"/>"#,
                    (x1 - x0).max(1.0),
                    H - PAD_T - PAD_B
                );
            }
            // 5.5 px per character at the marks' 10 px font.
            let width = 5.5 * m.label.chars().count() as f64 + 6.0;
            let row = rows.iter().position(|&end| end <= x0).unwrap_or(rows.len());
            if row == rows.len() {
                rows.push(0.0);
            }
            rows[row] = x0 + width;
            let label_y = PAD_T + 10.0 + 11.0 * row as f64;
            let _ = write!(
                s,
                r#"<line x1="{x0:.1}" x2="{x0:.1}" y1="{PAD_T}" y2="{:.1}" stroke="{FAULT_COLOR}" stroke-dasharray="3 3"><title>{}</title></line>"#,
                H - PAD_B,
                esc(&m.label)
            );
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{label_y:.1}" class="mark">{}</text>"#,
                x0 + 3.0,
                esc(&m.label)
            );
        }
        // Policy decisions: a tick under the plot per decision, its words on hover.
        for d in self.decisions {
            let x = self.x(d.t);
            let _ = write!(
                s,
                r#"<path d="M{x:.1},{:.1}l-3,6h6z" fill="{}"><title>{} at {}: {}</title></path>"#,
                H - PAD_B + 1.0,
                decision_color(d.kind),
                d.kind,
                fmt_time(d.t),
                esc(&d.label)
            );
        }
        for (a, b, color) in &self.shading {
            let x0 = self.x(*a);
            let x1 = self.x(*b);
            let _ = write!(
                s,
                r#"<rect x="{x0:.1}" y="{PAD_T}" width="{w:.1}" height="{h:.1}" fill="{color}" opacity="0.14"/><rect x="{x0:.1}" y="{:.1}" width="{w:.1}" height="5" fill="{color}"><title>fail-open {}-{}</title></rect>"#,
                H - PAD_B - 5.0,
                fmt_time(*a),
                fmt_time(*b),
                w = (x1 - x0).max(1.0),
                h = H - PAD_T - PAD_B,
            );
        }
        // Axes and grid.
        for k in 0..=4 {
            let v = self.y_min + (self.y_max - self.y_min) * f64::from(k) / 4.0;
            let y = self.y(v);
            let _ = write!(
                s,
                r##"<line x1="{PAD_L}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#d0d7de" stroke-width="0.5"/><text x="{:.1}" y="{:.1}" class="axis" text-anchor="end">{}</text>"##,
                W - PAD_R,
                PAD_L - 4.0,
                y + 3.0,
                esc(&(self.y_fmt)(v))
            );
        }
        for k in 0..=6 {
            let t = self.x_max * f64::from(k) / 6.0;
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{:.1}" class="axis" text-anchor="middle">{}</text>"#,
                self.x(t),
                H - 10.0,
                fmt_time(t)
            );
        }
        for l in &self.lines {
            let mut d = String::new();
            for (k, (t, v)) in l.points.iter().enumerate() {
                let _ = write!(
                    d,
                    "{}{:.1},{:.1}",
                    if k == 0 { "M" } else { "L" },
                    self.x(*t),
                    self.y(v.clamp(self.y_min, self.y_max))
                );
            }
            let _ = write!(
                s,
                r#"<path d="{d}" fill="none" stroke="{}" stroke-width="1.6"{}><title>{}</title></path>"#,
                l.color,
                if l.dashed {
                    r#" stroke-dasharray="6 3""#
                } else {
                    ""
                },
                esc(l.label)
            );
        }
        s.push_str("</svg>");
        s
    }
}

fn fail_open_bands(series: &[Sample], bucket: f64) -> Vec<(f64, f64)> {
    let mut bands: Vec<(f64, f64)> = Vec::new();
    for smp in series {
        if smp.fail_open > 0.0 {
            let (a, b) = (smp.t, smp.t + bucket);
            match bands.last_mut() {
                Some(last) if (last.1 - a).abs() < 1e-6 => last.1 = b,
                _ => bands.push((a, b)),
            }
        }
    }
    bands
}

fn runs(checked: &Checked) -> Vec<(&RunOutcome, &'static str, bool)> {
    let mut v = vec![(&checked.vigil, VIGIL_COLOR, false)];
    if let Some(n) = &checked.naive {
        v.push((n, NAIVE_COLOR, true));
    }
    v
}

/// Renders the report of a checked scenario.
pub fn render(scenario: &Scenario, checked: &Checked) -> String {
    let cfg = &scenario.config;
    let x_max = cfg.duration.as_secs_f64();
    let all = runs(checked);
    let bucket = checked
        .vigil
        .series
        .get(1)
        .map_or(x_max, |s| s.t - checked.vigil.series[0].t);
    let marks = &checked.vigil.marks;
    let mut shading = Vec::new();
    for (o, _, naive) in &all {
        for (a, b) in fail_open_bands(&o.series, bucket) {
            shading.push((a, b, if *naive { NAIVE_COLOR } else { FAIL_OPEN_COLOR }));
        }
    }
    let servers = f64::from(cfg.fleet.servers);
    let in_service = Chart {
        title: "Servers in service (routed to and up); fail-open shaded",
        y_min: 0.0,
        y_max: servers,
        x_max,
        y_fmt: &|v| format!("{v:.0}"),
        lines: all
            .iter()
            .map(|(o, color, dashed)| Line {
                label: o.summary.policies,
                color,
                dashed: *dashed,
                points: o
                    .series
                    .iter()
                    .map(|s| (s.t, f64::from(s.in_service_min)))
                    .collect(),
            })
            .collect(),
        shading: shading.clone(),
        marks,
        decisions: &checked.vigil.decisions,
    };
    let success = |s: &Sample| {
        if s.requests == 0 {
            1.0
        } else {
            1.0 - s.failures as f64 / s.requests as f64
        }
    };
    let worst = all
        .iter()
        .flat_map(|(o, _, _)| o.series.iter().map(success))
        .fold(1.0f64, f64::min);
    let y_min = if worst > 0.99 {
        0.99
    } else if worst > 0.9 {
        0.9
    } else {
        0.0
    };
    let rate = Chart {
        title: "Client success rate",
        y_min,
        y_max: 1.0,
        x_max,
        y_fmt: &|v| format!("{:.1}%", v * 100.0),
        lines: all
            .iter()
            .map(|(o, color, dashed)| Line {
                label: o.summary.policies,
                color,
                dashed: *dashed,
                points: o.series.iter().map(|s| (s.t, success(s))).collect(),
            })
            .collect(),
        shading,
        marks,
        decisions: &checked.vigil.decisions,
    };
    let mut html = String::new();
    let _ = write!(
        html,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>vigil sim: {name}</title><style>
body{{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:960px;padding:0 1rem;color:#1f2328}}
h1{{font-size:1.5rem;margin-bottom:.2rem}} .sub{{color:#59636e;margin-top:0}}
table{{border-collapse:collapse;margin:1rem 0}} td,th{{padding:.25rem .8rem;border-bottom:1px solid #d0d7de;text-align:right}}
td:first-child,th:first-child{{text-align:left}} .ok{{color:#1a7f37;font-weight:600}} .fail{{color:#d1242f;font-weight:600}}
.legend span{{display:inline-block;margin-right:1.2rem}} .sw{{display:inline-block;width:18px;height:4px;vertical-align:middle;margin-right:.3rem}}
svg .title{{font-size:13px;font-weight:600;fill:#1f2328}} svg .axis{{font-size:10px;fill:#59636e}} svg .mark{{font-size:10px;fill:#59636e}}
.cards{{display:flex;gap:.8rem;flex-wrap:wrap;margin:1rem 0}} .card{{border:1px solid #d0d7de;border-radius:6px;padding:.5rem .9rem;min-width:150px}}
.card .k{{color:#59636e;font-size:12px}} .card .v{{font-size:1.35rem;font-weight:650}} .card .n{{font-size:.95rem;color:#d1242f}}
.chart{{margin:1.2rem 0;border:1px solid #d0d7de;border-radius:6px;padding:.4rem}} details{{margin:1rem 0}} code{{font-size:12px}}
</style></head><body>"#,
        name = esc(&cfg.name)
    );
    let _ = write!(
        html,
        "<h1>{}</h1><p class=\"sub\">{} servers in {} zones, {} simulated, seed {}. {}</p>",
        esc(&cfg.name),
        cfg.fleet.servers,
        cfg.fleet.zones,
        esc(&crate::summary::format_duration(cfg.duration)),
        checked.vigil.summary.seed,
        esc(&cfg.description)
    );
    html.push_str("<div class=\"legend\">");
    for (o, color, dashed) in &all {
        let _ = write!(
            html,
            r#"<span><i class="sw" style="background:{color}{}"></i>{}</span>"#,
            if *dashed { ";opacity:.8" } else { "" },
            o.summary.policies
        );
    }
    let _ = write!(
        html,
        r#"<span><i class="sw" style="background:{FAIL_OPEN_COLOR}"></i>vigil in fail-open</span><span><i class="sw" style="background:{FAULT_COLOR};opacity:.4"></i>fault</span></div>"#
    );
    html.push_str(&headline(
        &all.iter().map(|(o, _, _)| &o.summary).collect::<Vec<_>>(),
    ));
    let _ = write!(
        html,
        "<div class=\"chart\">{}</div><div class=\"chart\">{}</div>",
        in_service.svg(),
        rate.svg()
    );
    html.push_str(&summary_table(
        &all.iter().map(|(o, _, _)| &o.summary).collect::<Vec<_>>(),
    ));
    if !checked.verdicts.is_empty() {
        html.push_str("<h2>Expectations</h2><table><tr><th>run</th><th>expectation</th><th>measured</th><th></th></tr>");
        for v in &checked.verdicts {
            let _ = write!(
                html,
                "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td class=\"{}\">{}</td></tr>",
                v.policies,
                esc(&v.expectation),
                esc(&v.measured),
                if v.ok { "ok" } else { "fail" },
                if v.ok { "kept" } else { "BROKEN" }
            );
        }
        html.push_str("</table>");
    }
    for (o, _, _) in &all {
        let _ = write!(
            html,
            "<details><summary>Notable events, {} ({})</summary><table>",
            o.summary.policies,
            o.log.len()
        );
        for (t, line) in &o.log {
            let _ = write!(
                html,
                "<tr><td>{:.1}s</td><td style=\"text-align:left\">{}</td></tr>",
                t.as_secs_f64(),
                esc(line)
            );
        }
        html.push_str("</table></details>");
    }
    html.push_str("<p class=\"sub\">Generated by <code>vigil sim</code>: the same scenario and seed always give this very page.</p></body></html>\n");
    html
}

/// A headline card: its label and how to compute its value.
type Card = (&'static str, fn(&Summary) -> String);

/// Big numbers first: vigil's, with naive's beneath when comparing.
fn headline(runs: &[&Summary]) -> String {
    let cards: [Card; 4] = [
        ("availability", |s| {
            format!("{:.3}%", s.availability * 100.0)
        }),
        ("fewest servers in service", |s| {
            format!("{} of {}", s.min_in_service, s.servers)
        }),
        ("servers replaced", |s| s.controller_actions.to_string()),
        ("fail-open episodes", |s| s.fail_open_episodes.to_string()),
    ];
    let mut h = String::from("<div class=\"cards\">");
    for (label, f) in cards {
        let _ = write!(
            h,
            "<div class=\"card\"><div class=\"k\">{label}</div><div class=\"v\">{}</div>",
            esc(&f(runs[0]))
        );
        if let Some(n) = runs.get(1) {
            let _ = write!(h, "<div class=\"n\">naive: {}</div>", esc(&f(n)));
        }
        h.push_str("</div>");
    }
    h.push_str("</div>");
    h
}

fn summary_table(runs: &[&Summary]) -> String {
    let mut h = String::from("<h2>Summary</h2><table><tr><th></th>");
    for s in runs {
        let _ = write!(h, "<th>{}</th>", s.policies);
    }
    h.push_str("</tr>");
    let rows: Vec<_> = runs.iter().map(|s| s.rows()).collect();
    for (k, (label, _)) in rows[0].iter().enumerate() {
        let _ = write!(h, "<tr><td>{}</td>", esc(label));
        for r in &rows {
            let _ = write!(h, "<td>{}</td>", esc(r.get(k).map_or("", |(_, v)| v)));
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
