//! thp-split's verdicts: what locking part of a run of transparent huge pages does to the
//! VMA and to the huge pages (smaps after each step), and the tracer's VMA changes and
//! locked pages of each call against smaps.

use serde_json::Value;

use super::{ScenarioRun, Verdict, check, claim};

fn u(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

fn joined(figures: &[i64]) -> String {
    figures
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(" -> ")
}

/// A step's field, for each step (touched, mlock, munlock).
fn each_step(run: &ScenarioRun, field: &str) -> Vec<i64> {
    run.own["steps"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .map(|s| u(&s[field]))
        .collect()
}

/// The change of `figures` at each of the two calls.
fn changes(figures: &[i64]) -> Vec<i64> {
    figures.windows(2).map(|w| w[1] - w[0]).collect()
}

pub(super) fn assess(run: &ScenarioRun, v: &mut Vec<Verdict>) {
    let o = &run.own;
    let (region_kb, huge_kb, lock_kb) = (
        u(&o["region_kb"]),
        u(&o["huge_page_kb"]).max(1),
        u(&o["locked_kb"]),
    );
    let [vmas, thp, rss, locked] =
        ["vmas", "thp_kb", "rss_kb", "locked_kb"].map(|f| each_step(run, f));
    // The huge pages the locked range holds whole stay huge; the two it cuts do not.
    let whole = region_kb - 2 * huge_kb;
    let given = thp.first().copied().unwrap_or(0);
    let as_expected = vmas == [1, 3, 1]
        && thp == [region_kb, whole, whole]
        && rss == [region_kb; 3]
        && locked == [0, lock_kb, 0];
    let why = if given < region_kb {
        // The workload's own account of what it tried, where it gives one.
        let shortfall = o["shortfall"].as_str().map_or_else(
            || {
                format!(
                    "the kernel gave {} of the {} huge pages at first touch",
                    given / huge_kb,
                    region_kb / huge_kb
                )
            },
            str::to_string,
        );
        format!("{shortfall}: the split cannot be shown on this machine now")
    } else {
        "a PMD that a VMA boundary crosses is split: the two huge pages the lock's ends cut \
         through are mapped with 4 KiB entries from then on (out of AnonHugePages, still \
         resident: Rss unchanged), the one inside stays huge; munlock merges the VMAs but the \
         pages stay split until khugepaged collapses them"
            .into()
    };
    v.push(claim(
        "mlock of a range that starts and ends inside transparent huge pages splits the VMA \
         and the huge pages at both ends; munlock merges the VMA back, not the huge pages",
        "Linux mm: a VMA boundary inside a huge page splits its PMD (vma_adjust_trans_huge)",
        format!(
            "VMAs {}; AnonHugePages {} kB; Rss {} kB; Locked {} kB",
            joined(&vmas),
            joined(&thp),
            joined(&rss),
            joined(&locked)
        ),
        given == region_kb && as_expected,
        &why,
    ));

    // The tracer's VMA family, call by call, against /proc's VMA counts and Locked.
    let calls: Vec<&Value> = run.vma_calls.iter().filter(|c| c["ret"] == 0).collect();
    let traced_vmas: Vec<i64> = calls
        .iter()
        .map(|c| u(&c["counts"]["splits"]) - u(&c["counts"]["merges"]))
        .collect();
    let described: Vec<String> = calls
        .iter()
        .map(|c| {
            format!(
                "{} {} splits {} merges",
                c["syscall"].as_str().unwrap_or("?"),
                c["counts"]["splits"],
                c["counts"]["merges"]
            )
        })
        .collect();
    let proc_vmas = changes(&vmas);
    v.push(check(
        "VMA splits minus merges of each call (tracer) = /proc's VMA count change",
        format!("{proc_vmas:?}"),
        format!("{traced_vmas:?} ({})", described.join(", ")),
        traced_vmas == proc_vmas,
    ));
    let proc_locked: Vec<i64> = changes(&locked).iter().map(|kb| kb * 1024).collect();
    let traced_locked: Vec<i64> = calls
        .iter()
        .map(|c| u(&c["counts"]["locked_bytes"]) - u(&c["counts"]["unlocked_bytes"]))
        .collect();
    let locked_vm: Vec<i64> = run
        .events
        .iter()
        .map(|e| (u(&e["locked_vm_after"]) - u(&e["locked_vm_before"])) * 4096)
        .collect();
    v.push(check(
        "bytes each call locked (tracer's VM_LOCKED changes and locked_vm) = smaps Locked change",
        format!("{proc_locked:?}"),
        format!("{traced_locked:?}, locked_vm {locked_vm:?}"),
        traced_locked == proc_locked && locked_vm == proc_locked,
    ));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::lab::workload::scenario::Scenario;

    fn run(thp: [i64; 3], splits: [(u32, u32); 2]) -> ScenarioRun {
        let steps: Vec<Value> = [(1, 0), (3, 4096), (1, 0)]
            .iter()
            .zip(thp)
            .map(|(&(vmas, locked), thp)| {
                json!({"vmas": vmas, "thp_kb": thp, "rss_kb": 6144, "locked_kb": locked})
            })
            .collect();
        let call = |syscall: &str, (splits, merges): (u32, u32), locked: i64| {
            json!({"syscall": syscall, "ret": 0, "counts": {"splits": splits, "merges": merges,
                "locked_bytes": locked.max(0), "unlocked_bytes": (-locked).max(0)}})
        };
        ScenarioRun {
            scenario: Scenario::ThpSplit,
            secs: 1.0,
            own: json!({"region_kb": 6144, "huge_page_kb": 2048, "locked_kb": 4096,
                "steps": steps}),
            traced: Vec::new(),
            events: vec![
                json!({"locked_vm_before": 0, "locked_vm_after": 1024}),
                json!({"locked_vm_before": 1024, "locked_vm_after": 0}),
            ],
            vma_calls: vec![
                call("mlock", splits[0], 4 << 20),
                call("munlock", splits[1], -(4 << 20)),
            ],
        }
    }

    fn verdicts(run: &ScenarioRun) -> Vec<&'static str> {
        let mut v = Vec::new();
        assess(run, &mut v);
        v.iter().map(|v| v.verdict).collect()
    }

    #[test]
    fn the_ends_split_and_stay_split() {
        let split = run([6144, 2048, 2048], [(2, 0), (0, 2)]);
        assert_eq!(verdicts(&split), ["agrees", "consistent", "consistent"]);
        // The pages collapsed back at munlock: not what the claim says.
        let collapsed = run([6144, 2048, 6144], [(2, 0), (0, 2)]);
        assert_eq!(verdicts(&collapsed)[0], "disagrees");
        // A tracer that missed a merge.
        let missed = run([6144, 2048, 2048], [(2, 0), (0, 1)]);
        assert_eq!(verdicts(&missed)[1], "INCONSISTENT");
    }

    #[test]
    fn too_few_huge_pages_say_so() {
        let short = run([4096, 2048, 2048], [(2, 0), (0, 2)]);
        let mut v = Vec::new();
        assess(&short, &mut v);
        assert_eq!(v[0].verdict, "disagrees");
        assert!(
            v[0].why.contains("gave 2 of the 3 huge pages"),
            "{}",
            v[0].why
        );
        // What the workload tried, where it says.
        let mut said = short;
        said.own["shortfall"] = json!("the kernel gave 4096 of 6144 kB after 3 tries");
        let mut v = Vec::new();
        assess(&said, &mut v);
        assert_eq!(
            v[0].why,
            "the kernel gave 4096 of 6144 kB after 3 tries: the split cannot be shown on this \
             machine now"
        );
    }
}
