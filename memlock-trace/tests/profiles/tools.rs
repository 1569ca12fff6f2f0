//! What the established tools make of the runs of `profiles.rs`, and memlock-trace's folded
//! lines read the same way: perf's samples collapsed by inferno, the flame graph's titles
//! (quick-xml) and `go tool pprof`'s traces.

use std::{collections::BTreeMap, path::Path, process::Command};

use inferno::collapse::{
    Collapse as _,
    perf::{Folder, Options},
};

use super::support::{stacks::perf_script, succeeded};

/// Folded lines as a map from stack to count.
pub(super) fn parse_folded(text: &str) -> BTreeMap<String, u64> {
    let mut lines = BTreeMap::new();
    for line in text.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line:?}"));
        *lines.entry(stack.to_string()).or_default() += n.parse::<u64>().unwrap();
    }
    lines
}

/// perf's samples in `data`, collapsed by inferno-collapse-perf (stackcollapse-perf.pl's
/// port) with its defaults.
pub(super) fn perf_collapsed(data: &Path) -> BTreeMap<String, u64> {
    let script = perf_script(&[], data);
    let mut folded = Vec::new();
    Folder::from(Options::default())
        .collapse(script.as_bytes(), &mut folded)
        .unwrap();
    parse_folded(&String::from_utf8(folded).unwrap())
}

/// The lines of `comm` whose leaf is `leaf`, cut to their frames from `from` up (the root
/// frames before it left out), with their counts.
pub(super) fn from_frame(
    lines: &BTreeMap<String, u64>,
    comm: &str,
    from: &str,
    leaf: &str,
) -> Vec<String> {
    lines
        .iter()
        .filter(|(stack, _)| stack.starts_with(&format!("{comm};")))
        .filter(|(stack, _)| stack.ends_with(&format!(";{leaf}")))
        .map(|(stack, n)| {
            let frames: Vec<&str> = stack.split(';').collect();
            let at = frames.iter().position(|f| *f == from).unwrap_or(0);
            format!("{} {n}", frames[at..].join(";"))
        })
        .collect()
}

/// The text of every `<title>` of an SVG, which must parse as XML with an `<svg>` root.
pub(super) fn svg_titles(path: &Path) -> Vec<String> {
    use quick_xml::{Reader, events::Event};
    let text = std::fs::read_to_string(path).unwrap();
    let mut reader = Reader::from_str(&text);
    let (mut titles, mut in_title, mut root) = (Vec::new(), false, None);
    loop {
        match reader
            .read_event()
            .unwrap_or_else(|e| panic!("not XML: {e}"))
        {
            Event::Start(e) => {
                let name = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
                root.get_or_insert(name.clone());
                if name == "title" {
                    in_title = true;
                    titles.push(String::new());
                }
            }
            Event::End(e) if e.local_name().as_ref() == b"title" => in_title = false,
            Event::Text(t) if in_title => titles.last_mut().unwrap().push_str(&t.decode().unwrap()),
            Event::GeneralRef(r) if in_title => {
                let entity = match r.decode().unwrap().as_ref() {
                    "amp" => "&",
                    "lt" => "<",
                    "gt" => ">",
                    "quot" => "\"",
                    "apos" => "'",
                    other => panic!("entity {other}"),
                };
                titles.last_mut().unwrap().push_str(entity);
            }
            Event::Eof => break,
            _ => {}
        }
    }
    assert_eq!(root.as_deref(), Some("svg"), "the SVG's root element");
    titles
}

/// `go tool pprof ARGS FILE`'s output (Debian's golang-go).
pub(super) fn go_pprof(args: &[&str], file: &Path) -> String {
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        // go wants a writable home for its caches; the test's own.
        .env("HOME", file.parent().unwrap())
        .output()
        .unwrap_or_else(|e| {
            panic!("go: {e} (`cargo xtask test` installs Debian's golang-go; or: apt-get install golang-go)")
        });
    succeeded("go tool pprof", &out)
}

/// `go tool pprof -traces`'s samples of `comm`: (value as printed, frames innermost first).
pub(super) fn pprof_traces(text: &str, comm: &str) -> Vec<(String, Vec<String>)> {
    text.split("-----------+")
        .filter(|block| block.lines().any(|l| l.trim() == format!("comm:  {comm}")))
        .filter_map(|block| {
            let mut frames = block
                .lines()
                .skip(1)
                .filter(|l| !l.trim().is_empty() && !l.contains(":  "));
            let first = frames.next()?;
            let (value, leaf) = first.trim().split_once(char::is_whitespace)?;
            let mut stack = vec![leaf.trim().to_string()];
            stack.extend(frames.map(|l| l.trim().to_string()));
            Some((value.to_string(), stack))
        })
        .collect()
}
