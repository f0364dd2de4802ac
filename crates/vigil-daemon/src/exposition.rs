//! The Prometheus exposition of a vigil process: [`encode`] writes registries in the
//! format the scraper's `Accept` header asks for, with `vigil_build_info`.
//!
//! prometheus-client only writes OpenMetrics, whose counter families are named without
//! `_total` (`# TYPE vigil_probes counter`, sample `vigil_probes_total`): a plain-text
//! scraper (Prometheus' text parser, `promtool check metrics`) then finds no HELP for
//! the samples (client_rust #194). So OpenMetrics goes to scrapers that ask for it, and
//! everyone else gets the 0.0.4 text format, with the family names fixed.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// Content type of the OpenMetrics text format.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// Content type of Prometheus' plain text format 0.0.4.
pub const TEXT_0_0_4: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Registers `vigil_build_info{version,commit} 1` (a gauge, as exporters name their
/// build info): which vigil build serves these metrics.
pub fn register_build_info(registry: &mut Registry) {
    registry.register_collector(Box::new(BuildInfo));
}

#[derive(Debug)]
struct BuildInfo;

impl Collector for BuildInfo {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let g = ConstGauge::new(1);
        let labels = [
            ("version", vigil_core::build::VERSION),
            ("commit", vigil_core::build::COMMIT),
        ];
        g.encode(
            encoder
                .encode_descriptor(
                    "vigil_build_info",
                    "The vigil build: its version and git commit.",
                    None,
                    g.metric_type(),
                )?
                .encode_family(&labels)?,
        )
    }
}

/// A registry holding only `vigil_build_info`, for an exposition whose own registry has
/// a prefix (see [`encode_all`]).
pub fn build_info_registry() -> Registry {
    let mut registry = Registry::default();
    register_build_info(&mut registry);
    registry
}

/// `registry` as `(content type, body)` in the format `accept` (the request's `Accept`
/// header) asks for: OpenMetrics when it names `application/openmetrics-text` (as
/// Prometheus does), else the 0.0.4 text format.
pub fn encode(registry: &Registry, accept: Option<&str>) -> (&'static str, String) {
    encode_all(&[registry], accept)
}

/// [`encode`] for several registries in one exposition (one `# EOF`).
pub fn encode_all(registries: &[&Registry], accept: Option<&str>) -> (&'static str, String) {
    let mut text = String::new();
    for registry in registries {
        prometheus_client::encoding::text::encode_registry(&mut text, registry)
            .expect("writing to a String cannot fail");
    }
    prometheus_client::encoding::text::encode_eof(&mut text)
        .expect("writing to a String cannot fail");
    if accept.is_some_and(wants_openmetrics) {
        (OPENMETRICS, text)
    } else {
        (TEXT_0_0_4, to_text_0_0_4(&text))
    }
}

/// Whether an `Accept` header lists OpenMetrics with a non-zero quality.
fn wants_openmetrics(accept: &str) -> bool {
    accept.split(',').any(|part| {
        let mut fields = part.split(';').map(str::trim);
        let media = fields.next().unwrap_or("");
        media.eq_ignore_ascii_case("application/openmetrics-text")
            && fields.all(|f| {
                f.strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_none_or(|q| q > 0.0)
            })
    })
}

/// OpenMetrics (as prometheus-client writes it) to the 0.0.4 text format: counter and
/// info families take their samples' names (`_total`, `_info`), info becomes gauge and
/// unknown untyped, `# UNIT` and `# EOF` go.
pub fn to_text_0_0_4(openmetrics: &str) -> String {
    let mut rename: std::collections::HashMap<&str, (&str, &str)> = Default::default();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some((name, kind)) = rest.split_once(' ')
        {
            match kind {
                "counter" => rename.insert(name, ("_total", "counter")),
                "info" => rename.insert(name, ("_info", "gauge")),
                "unknown" => rename.insert(name, ("", "untyped")),
                _ => None,
            };
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        if let Some((prefix, rest)) = meta
            && let Some((name, tail)) = rest.split_once(' ')
            && let Some((suffix, kind)) = rename.get(name)
        {
            let tail = if prefix == "# TYPE " { kind } else { tail };
            out.push_str(&format!("{prefix}{name}{suffix} {tail}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_chooses_openmetrics_only_when_asked_for() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(prometheus));
        assert!(wants_openmetrics("application/openmetrics-text"));
        assert!(!wants_openmetrics("text/plain;version=0.0.4"));
        assert!(!wants_openmetrics("*/*"));
        assert!(!wants_openmetrics("application/openmetrics-text;q=0"));
    }

    #[test]
    fn text_format_names_counter_families_after_their_samples() {
        let om = "# HELP x_probes Probes.\n# TYPE x_probes counter\nx_probes_total{a=\"b\"} 3\n\
                  # HELP x_build Build.\n# TYPE x_build info\nx_build_info{v=\"1\"} 1\n\
                  # HELP x_age_seconds Age.\n# TYPE x_age_seconds gauge\n# UNIT x_age_seconds seconds\n\
                  x_age_seconds 1.5\n# EOF\n";
        assert_eq!(
            to_text_0_0_4(om),
            "# HELP x_probes_total Probes.\n# TYPE x_probes_total counter\nx_probes_total{a=\"b\"} 3\n\
             # HELP x_build_info Build.\n# TYPE x_build_info gauge\nx_build_info{v=\"1\"} 1\n\
             # HELP x_age_seconds Age.\n# TYPE x_age_seconds gauge\nx_age_seconds 1.5\n"
        );
    }
}
