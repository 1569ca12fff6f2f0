//! The text as a reader meets it: one name per file in every table.

use super::{mapping, table};
use crate::advise::{
    apply::{Plan, compare},
    observe::Environment,
    render,
};

/// A file's name longer than the column reads the same in the mapping table and in
/// `--apply`'s comparison (issue 47 point 12: `…sr/lib/x86_64-linux-gnu/libc.so.6` in one,
/// the path whole beside its size in the other), cut from a `/`.
#[test]
fn a_long_path_is_cut_the_same_way_in_both_tables() {
    let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
    let t = table(vec![mapping(libc, 1_900_544, 10, 100)], 8 << 20, true);
    let plan = Plan {
        env: Environment::default(),
    };
    let c = compare(&t, Some(&t), Some(&plan), &[]);
    let text = render::apply_text(&t, &[], &c);
    let rows: Vec<&str> = text.lines().filter(|l| l.contains("libc.so.6")).collect();
    assert_eq!(rows.len(), 2, "{text}");
    for row in rows {
        assert!(
            row.starts_with("…/lib/x86_64-linux-gnu/libc.so.6   "),
            "{row:?} in:\n{text}"
        );
    }
}

/// Fewer faults from a run the advice broke (merged_table.py failed once its table was
/// locked apart from its malloc block, and the verdict said "helped"): not help.
#[test]
fn a_run_that_exits_otherwise_is_not_counted_as_help() {
    let before = table(vec![mapping("anonymous", 1 << 20, 0, 256)], 8 << 20, true);
    let mut after = table(vec![mapping("anonymous", 1 << 20, 0, 0)], 8 << 20, true);
    after.exit_code = Some(1);
    let plan = Plan {
        env: Environment::default(),
    };
    let c = compare(&before, Some(&after), Some(&plan), &[]);
    assert_eq!(c.helped, Some(false), "{}", c.verdict);
    assert!(
        c.verdict
            .contains("the command exited with status 1 this run, 0 before"),
        "{}",
        c.verdict
    );
    let same = compare(&before, Some(&before), Some(&plan), &[]);
    assert!(!same.verdict.contains("exited with"), "{}", same.verdict);
}
