//! The Prometheus text exposition as the tests read it: samples with their labels.

use std::collections::BTreeMap;

/// One sample: metric name, labels, value.
#[derive(Debug)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the text exposition (`name{k="v",...} value` lines; `#` lines are metadata).
pub fn parse(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|e| panic!("bad value in {line:?}: {e}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("bad labels in {line:?}"));
                let labels = body
                    .split("\",")
                    .filter(|kv| !kv.is_empty())
                    .map(|kv| {
                        let (k, v) = kv
                            .split_once("=\"")
                            .unwrap_or_else(|| panic!("bad label {kv:?} in {line:?}"));
                        (k.to_string(), v.trim_end_matches('"').to_string())
                    })
                    .collect();
                (name, labels)
            }
            None => (series, BTreeMap::new()),
        };
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    samples
}

/// The value of the one sample named `name` whose labels are exactly `labels` (the
/// `cgroup` label aside, unless `labels` has it: every process of these tests is in the
/// test's own cgroup).
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let found: Vec<&Sample> = samples
        .iter()
        .filter(|s| {
            let mut have = s.labels.clone();
            if !want.contains_key("cgroup") {
                have.remove("cgroup");
            }
            s.name == name && have == want
        })
        .collect();
    assert!(
        found.len() <= 1,
        "{name} {labels:?} appears {} times",
        found.len()
    );
    found.first().map(|s| s.value)
}
