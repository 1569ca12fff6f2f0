//! Reading the text summaries of `output_formats.rs`: libbpf-tools' histograms, the units
//! of the syscall table's latency columns, and the hook lines on stderr.

use std::{collections::BTreeMap, process::Output};

/// The histograms of a text summary: title line -> counts per `low -> high` row.
pub(super) fn histograms(text: &str) -> BTreeMap<String, Vec<(u64, u64, u64)>> {
    let mut out: BTreeMap<String, Vec<(u64, u64, u64)>> = BTreeMap::new();
    let mut title = None;
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if lines
            .peek()
            .is_some_and(|next| next.contains(" : count    distribution"))
        {
            title = Some(line.trim().to_string());
            out.entry(line.trim().to_string()).or_default();
            lines.next();
            continue;
        }
        let Some(t) = &title else { continue };
        let Some((range, rest)) = line.split_once(" : ") else {
            title = None;
            continue;
        };
        let Some((low, high)) = range.split_once(" -> ") else {
            title = None;
            continue;
        };
        let count = rest.split_whitespace().next().unwrap();
        assert!(rest.trim_end().ends_with('|'), "a bar: {line}");
        out.get_mut(t).unwrap().push((
            low.trim().parse().unwrap(),
            high.trim().parse().unwrap(),
            count.parse().unwrap(),
        ));
    }
    out
}

/// The latency columns of a syscall table: each column's unit suffixes.
pub(super) fn column_units(text: &str) -> Vec<Vec<&str>> {
    let mut columns = vec![Vec::new(); 4];
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // A table row is a call and its count (`mlock ENOMEM (last): ...` explains a failure).
        if fields.len() < 8
            || !["mlock", "mlock2", "munlock", "mlockall", "munlockall"].contains(&fields[0])
            || fields[1].parse::<u64>().is_err()
        {
            continue;
        }
        for (c, field) in columns.iter_mut().zip(&fields[2..6]) {
            c.push(if field.ends_with("ms") { "ms" } else { "us" });
            assert!(
                field
                    .trim_end_matches("ms")
                    .trim_end_matches("us")
                    .parse::<f64>()
                    .is_ok(),
                "{line}"
            );
        }
    }
    columns
}

/// Each latency column of the syscall table in one unit (`want` when fixed by -m/-u).
pub(super) fn check_units(text: &str, rows: usize, want: Option<&str>) {
    for column in column_units(text) {
        assert_eq!(column.len(), rows, "a row per call: {text}");
        assert!(
            column.iter().all(|u| *u == column[0]),
            "mixed units:\n{text}"
        );
        if let Some(want) = want {
            assert_eq!(column[0], want, "\n{text}");
        }
    }
}

/// The hook sets once on stderr, briefly; nothing of them in the text summary.
pub(super) fn check_hooks_on_stderr_once(out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    for detail in ["refused", "page faults traced with", "hooks"] {
        assert!(!stdout.contains(detail), "{detail:?} on stdout:\n{stdout}");
    }
    assert_eq!(
        stderr.matches("memlock-trace: faults: ").count(),
        1,
        "{stderr}"
    );
    assert!(!stderr.contains("run `memlock-trace probe`"), "{stderr}");
    // Refusals are noted without their reasons (-v gives those).
    assert_eq!(
        stderr.matches("refused").count(),
        stderr
            .matches("(better hooks refused: -v says why)")
            .count(),
        "{stderr}"
    );
}
