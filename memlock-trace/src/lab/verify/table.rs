//! The report in words: a region's layout, the calls' totals, and the table `verify` prints.

use std::fmt::Write as _;

use super::{ExpectCalls, Piece, Report};
use crate::procfs::PAGE_SIZE;

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

/// The report as a table: step, expected, traced, /proc says, verdict; then the mismatches.
pub fn table(report: &Report) -> String {
    let mut out = format!(
        "kernel {}; hooks: {}\n",
        report.kernel,
        report.hooks.lines().next().unwrap_or("")
    );
    let headers = ["step", "expected", "traced", "/proc says", "verdict"];
    let rows: Vec<[String; 5]> = report
        .steps
        .iter()
        .map(|r| {
            [
                r.step.clone(),
                r.expected.clone(),
                r.traced.clone(),
                r.proc.clone(),
                if r.ok { "ok".into() } else { "MISMATCH".into() },
            ]
        })
        .collect();
    let mut widths = headers.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 5]| -> String {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i > 0 {
                s.push_str(" | ");
            }
            let _ = write!(s, "{cell:<w$}");
        }
        s.trim_end().to_string() + "\n"
    };
    out.push_str(&line(headers));
    out.push_str(&line(
        widths.map(|w| "-".repeat(w)).each_ref().map(String::as_str),
    ));
    for row in &rows {
        out.push_str(&line(row.each_ref().map(String::as_str)));
    }
    for r in report.steps.iter().filter(|r| !r.ok) {
        let _ = writeln!(
            out,
            "\n{} (pid {}, tid {}): {}",
            r.step, r.pid, r.tid, r.action
        );
        for m in &r.mismatches {
            let _ = writeln!(out, "  - {m}");
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
        verify::scenarios::{N, RW, Y},
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
    fn repeated_functions_are_counted() {
        let names: Vec<String> = ["mlock_fixup", "split_vma", "split_vma", "mlock_fixup"]
            .map(String::from)
            .to_vec();
        assert_eq!(run_lengths(&names), "mlock_fixup split_vma x2 mlock_fixup");
        assert_eq!(run_lengths(&[]), "");
    }
}
