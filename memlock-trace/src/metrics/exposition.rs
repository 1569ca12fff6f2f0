//! Which text format a scrape gets: the Prometheus text format 0.0.4 unless the scraper's
//! `Accept` asks for OpenMetrics (Prometheus does; curl and most tools do not).
//!
//! prometheus-client encodes both. They differ where `promtool check metrics` (which reads
//! 0.0.4 only) saw "no help text": a counter's family is `x` with samples `x_total` in
//! OpenMetrics, `x_total` in 0.0.4; 0.0.4 has no `# UNIT` and no `# EOF`.

/// Content type of the Prometheus text format.
pub const TEXT_004: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Content type of OpenMetrics.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text004,
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when `accept` lists `application/openmetrics-text` with a weight at
    /// least that of any text/plain or wildcard it lists; 0.0.4 otherwise.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let mut openmetrics: Option<f32> = None;
        let mut text = 0.0f32;
        for range in accept.unwrap_or("").split(',') {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("").to_ascii_lowercase();
            let q = parts
                .find_map(|p| p.strip_prefix("q=").and_then(|v| v.parse::<f32>().ok()))
                .unwrap_or(1.0);
            match media.as_str() {
                "application/openmetrics-text" => {
                    openmetrics = Some(openmetrics.map_or(q, |o: f32| o.max(q)));
                }
                "text/plain" | "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
        match openmetrics {
            Some(q) if q > 0.0 && q >= text => Self::OpenMetrics,
            _ => Self::Text004,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::Text004 => TEXT_004,
            Self::OpenMetrics => OPENMETRICS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        assert_eq!(Format::negotiate(None), Format::Text004);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Text004);
        assert_eq!(
            Format::negotiate(Some("text/plain;version=0.0.4")),
            Format::Text004
        );
        // Prometheus 2.42's header.
        assert_eq!(
            Format::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                 version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            )),
            Format::OpenMetrics
        );
        assert_eq!(
            Format::negotiate(Some("text/plain;q=1,application/openmetrics-text;q=0.5")),
            Format::Text004
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0")),
            Format::Text004
        );
    }
}
