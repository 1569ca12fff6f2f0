//! The report in words: a region's layout, the calls' totals, and the table `verify` prints.

use std::fmt::Write as _;

use super::{ExpectCalls, Piece, Report};
use crate::{
    output::{COLUMNS, wrap},
    procfs::PAGE_SIZE,
};

/// `[4 rw][8 rw lo][4 rw]`: sizes in pages from the region's start; a piece that does not
/// start where the previous one ended (or at the region's start) shows its page offset.
pub fn layout_str(window: (u64, u64), pieces: &[Piece]) -> String {
    let mut out = String::new();
    let mut at = window.0;
    for p in pieces {
        out.push('[');
        if p.start != at {
            let offset = (i128::from(p.start) - i128::from(window.0)) / i128::from(PAGE_SIZE);
            let _ = write!(out, "@{offset} ");
        }
        let prot: String = p.perms.chars().take(3).filter(|&c| c != '-').collect();
        let _ = write!(
            out,
            "{} {}",
            p.end.saturating_sub(p.start) / PAGE_SIZE,
            if prot.is_empty() { "--" } else { &prot }
        );
        if p.locked {
            out.push_str(" lo");
        }
        if p.onfault {
            out.push_str(" lf");
        }
        out.push(']');
        at = p.end;
    }
    if at != window.1 {
        let _ = write!(
            out,
            "(ends {:+} pages off)",
            (i128::from(at) - i128::from(window.1)) / i128::from(PAGE_SIZE)
        );
    }
    if pieces.is_empty() {
        out.push_str("(nothing mapped)");
    }
    out
}

pub(super) fn calls_str(c: &ExpectCalls) -> String {
    let mut parts = Vec::new();
    let mut add = |label: &str, v: Option<String>| {
        if let Some(v) = v {
            parts.push(format!("{label}{v}"));
        }
    };
    add("split ", c.splits.map(|v| v.to_string()));
    add("merge ", c.merges.map(|v| v.to_string()));
    add("lo ", c.locked_pages.map(|v| format!("{v:+}p")));
    if c.onfault_pages.is_some_and(|v| v != 0) {
        add("lf ", c.onfault_pages.map(|v| format!("{v:+}p")));
    }
    add("map_count ", c.map_count.map(|v| format!("{v:+}")));
    add("locked_vm ", c.locked_vm.map(|v| format!("{v:+}")));
    add("locked_vm=", c.locked_vm_after.map(|v| v.to_string()));
    add("populated ", c.populated.map(|v| v.to_string()));
    parts.join(" ")
}

/// `mlock_fixup x40 split_vma __split_vma`: repeats in a row counted.
pub(super) fn run_lengths(names: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < names.len() {
        let run = names[i..].iter().take_while(|n| **n == names[i]).count();
        out.push(if run > 1 {
            format!("{} x{run}", names[i])
        } else {
            names[i].clone()
        });
        i += run;
    }
    out.join(" ")
}

/// Column widths of the table: step (at most), agrees, and what was checked (the rest).
const MAX_STEP_COLUMN: usize = 34;
const AGREES_COLUMN: usize = 6;

/// The report as a table that fits 100 columns: step, whether expected, traced and /proc
/// agree, and the checked value once (all three where they differ); then the mismatches.
/// The three views in full are in `verify --json`.
pub fn table(report: &Report) -> String {
    let mut out = String::new();
    let hooks = report.hooks.lines().next().unwrap_or("");
    for line in wrap(
        &format!("kernel {}; hooks:", report.kernel),
        hooks,
        COLUMNS,
        4,
    ) {
        let _ = writeln!(out, "{line}");
    }
    let step_column = report
        .steps
        .iter()
        .map(|r| r.step.chars().count())
        .fold(4, usize::max)
        .min(MAX_STEP_COLUMN);
    let value_column = COLUMNS - step_column - AGREES_COLUMN - 6;
    let row = |out: &mut String, cells: [&str; 3]| {
        let step = wrap("", cells[0], step_column, 2);
        let value = wrap("", cells[2], value_column, 2);
        for i in 0..step.len().max(value.len()) {
            let cell = |lines: &[String]| lines.get(i).cloned().unwrap_or_default();
            let agrees = if i == 0 { cells[1] } else { "" };
            let line = format!(
                "{:<step_column$} | {agrees:<AGREES_COLUMN$} | {}",
                cell(&step),
                cell(&value)
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
    };
    row(&mut out, ["step", "agrees", "expected = traced = /proc"]);
    let _ = writeln!(
        out,
        "{}-|-{}-|-{}",
        "-".repeat(step_column),
        "-".repeat(AGREES_COLUMN),
        "-".repeat(value_column)
    );
    for r in &report.steps {
        let value = if r.ok {
            r.expected.clone()
        } else if r.expected.is_empty() && r.traced.is_empty() && r.proc.is_empty() {
            // A scenario that failed before its step's checkpoint: nothing was compared.
            "not checked: the scenario failed (below)".to_string()
        } else {
            format!(
                "expected {}, traced {}, /proc {}",
                r.expected, r.traced, r.proc
            )
        };
        row(&mut out, [&r.step, if r.ok { "yes" } else { "NO" }, &value]);
    }
    for r in report.steps.iter().filter(|r| !r.ok) {
        let _ = writeln!(out);
        let head = format!("{} (pid {}, tid {}):", r.step, r.pid, r.tid);
        for line in wrap(&head, &r.action, COLUMNS, 2) {
            let _ = writeln!(out, "{line}");
        }
        for m in &r.mismatches {
            for line in wrap("  -", m, COLUMNS, 4) {
                let _ = writeln!(out, "{line}");
            }
        }
    }
    let _ = writeln!(
        out,
        "\n{} steps agree, {} mismatch",
        report.passed, report.failed
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::{
        verify::{
            StepResult,
            scenarios::{N, RW, Y},
        },
        workload::Region,
    };

    #[test]
    fn layouts_render_relative_to_the_region() {
        let r = Region::guarded(16, RW).unwrap();
        let l = r.layout(&[(4, "rw-p", N, N), (8, "rw-p", Y, Y), (4, "r-xp", N, N)]);
        assert_eq!(layout_str(r.window(), &l), "[4 rw][8 rw lo lf][4 rx]");
        // A VMA reaching below the region (it merged with a neighbour) shows its offset.
        let merged = [Piece {
            start: r.start() - PAGE_SIZE,
            end: r.at(16),
            perms: "rw-p".into(),
            locked: false,
            onfault: false,
        }];
        assert_eq!(layout_str(r.window(), &merged), "[@-1 17 rw]");
        assert_eq!(
            layout_str(r.window(), &[]),
            "(ends -16 pages off)(nothing mapped)"
        );
    }

    #[test]
    fn the_table_fits_100_columns_and_shows_a_value_once_when_all_agree() {
        let long = "[4 rw][8 rw lo][4 rw] Locked 32k Rss 64k; split 1 merge 0 lo +8p \
                    map_count +2 locked_vm +8 populated 8; locked_vm 8; born locked";
        let step = |name: &str, ok: bool, traced: &str| StepResult {
            step: name.into(),
            action: "mlock pages 4-11 of an 16-page VMA (page 0 touched)".into(),
            pid: 1,
            tid: 1,
            expected: long.into(),
            traced: traced.into(),
            proc: "[4 rw][8 rw lo][4 rw] Locked 32k Rss 64k".into(),
            ok,
            mismatches: if ok {
                vec![]
            } else {
                vec![format!("traced VMAs {traced} != expected {long}")]
            },
            stores: 2,
            functions: vec![],
            expected_layout: vec![],
            traced_layout: vec![],
            proc_layout: vec![],
        };
        let report = Report {
            kind: "verify",
            kernel: "6.18.0".into(),
            hooks: "tp_btf maple_tree:ma_write (fentry refused: BPF_PROG_LOAD: Operation not \
                    permitted (os error 1); kprobe refused: no kprobe PMU)"
                .into(),
            smaps_shows_lf: true,
            steps: vec![
                step("mlock-middle", true, long),
                step("mlock-adjacent", false, "[16 rw]"),
            ],
            passed: 1,
            failed: 1,
        };
        let text = table(&report);
        for line in text.lines() {
            assert!(
                line.chars().count() <= COLUMNS,
                "{} long: {line}",
                line.len()
            );
        }
        // Agreeing: the value once; disagreeing: each view.
        assert_eq!(text.matches("+8p").count(), 3, "{text}");
        assert!(text.contains("mlock-middle"), "{text}");
        assert!(text.contains("| NO     | expected [4 rw]"), "{text}");
        assert!(
            text.contains(", traced") && text.contains("[16 rw]"),
            "{text}"
        );
    }

    #[test]
    fn repeated_functions_are_counted() {
        let names: Vec<String> = ["mlock_fixup", "split_vma", "split_vma", "mlock_fixup"]
            .map(String::from)
            .to_vec();
        assert_eq!(run_lengths(&names), "mlock_fixup split_vma x2 mlock_fixup");
        assert_eq!(run_lengths(&[]), "");
    }
}
