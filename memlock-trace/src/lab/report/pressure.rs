//! The memory-pressure scenario's verdicts: what the references claim locking guarantees
//! under pressure (never swapped, never a major fault from swap, a secret never on the swap
//! device; munlock hands the pages back to reclaim), against smaps, getrusage, the cgroup's
//! `memory.stat` and the swap device itself; and the tracer's major faults against the
//! kernel's count.

use serde_json::Value;

use super::{ScenarioRun, Verdict, check, claim, f};
use crate::lab::pressure::cgroup::stat_lag_kb;

/// What mlock does not keep out of reach, whatever the swap device holds.
const NOT_COVERED: &str = "mlock keeps a page out of swap, not out of a core dump \
    (MADV_DONTDUMP does) nor out of a forked child's copy-on-write copy, which is not locked \
    (fork-inherit); memfd_secret (Linux 5.14) takes the pages out of the kernel's own mapping too";

pub(super) fn assess(run: &ScenarioRun, v: &mut Vec<Verdict>) {
    let o = &run.own;
    let (out, again) = (&o["pushed_out"], &o["touched_again"]);
    let swapped_kb = |r: &str| f(&out[r]["swap_kb"]);
    let majors = |r: &str| f(&again[r]["faults"]["majflt"]);
    let ms = |r: &str| f(&again[r]["ns"]) / 1e6;
    let region_kb = f(&o["region_pages"]) * f(&o["page_size"]) / 1024.0;
    let unevictable_kb = f(&o["cgroup_stat"]["unevictable"]) / 1024.0;
    let others_swapped = swapped_kb("lazy") > 0.0 && swapped_kb("populate") > 0.0;
    v.push(claim(
        "locked pages are not reclaimed and never swapped out",
        "000, section 1",
        format!(
            "under a {} MiB cgroup limit with {} MiB of pressure: locked region {} kB in swap \
             ({} kB Locked, cgroup unevictable {unevictable_kb:.0} kB); lazy {} kB, \
             MAP_POPULATE {} kB of {region_kb:.0} kB in swap",
            o["limit_mib"],
            o["pressure_mib"],
            swapped_kb("mlock"),
            f(&out["mlock"]["locked_kb"]),
            swapped_kb("lazy"),
            swapped_kb("populate"),
        ),
        swapped_kb("mlock") == 0.0
            && f(&out["mlock"]["locked_kb"]) == region_kb
            && unevictable_kb + stat_lag_kb() as f64 >= region_kb
            && others_swapped,
        "smaps Swap and Locked per region and the cgroup's memory.stat, read with the pressure \
         still mapped; mlock moves the pages to the unevictable list, which reclaim never scans",
    ));
    v.push(claim(
        "a locked page never becomes a major fault from swap; MAP_POPULATE only prefaults",
        "001 (inferred there: its container had no swap)",
        format!(
            "touched again: locked {} major faults in {:.1} ms; MAP_POPULATE {} in {:.1} ms; \
             lazy {} in {:.1} ms",
            majors("mlock"),
            ms("mlock"),
            majors("populate"),
            ms("populate"),
            majors("lazy"),
            ms("lazy"),
        ),
        majors("mlock") == 0.0 && majors("populate") > 0.0 && majors("lazy") > 0.0,
        "getrusage around each region's second touch, the pressure unmapped first; \
         MAP_POPULATE's pages were on the LRU like any others",
    ));
    let m = &o["munlock"];
    v.push(claim(
        "munlock does not reclaim the pages at once; it puts them back where reclaim takes them",
        "000, section 1",
        format!(
            "right after munlock {} kB in swap, {} kB resident; after the same pressure {} kB \
             in swap; touched again: {} major faults in {:.1} ms",
            f(&m["right_after"]["swap_kb"]),
            f(&m["right_after"]["rss_kb"]),
            f(&m["pushed_out"]["swap_kb"]),
            f(&m["touched_again"]["faults"]["majflt"]),
            f(&m["touched_again"]["ns"]) / 1e6,
        ),
        f(&m["right_after"]["swap_kb"]) == 0.0
            && f(&m["right_after"]["rss_kb"]) == region_kb
            && f(&m["pushed_out"]["swap_kb"]) > 0.0,
        "smaps of the formerly locked region",
    ));
    secret(o, v);
    tracer_majors(run, v);
    faults_by_region(run, v);
    delay_accounting(run, v);
}

/// Each region's faults, as the tracer's mapping rows counted them, against what the kernel
/// says each step did there: one fault per page when it was first touched or populated by
/// its call, and one per page smaps said was in swap when it was touched again (a swap-in, or
/// a swap-cache hit). getrusage around a step would count the process's other faults too
/// (its own code read back in under the pressure).
fn faults_by_region(run: &ScenarioRun, v: &mut Vec<Verdict>) {
    let o = &run.own;
    let pages = f(&o["region_pages"]);
    let page_kb = f(&o["page_size"]) / 1024.0;
    let swapped = |seen: &Value| f(&seen["swap_kb"]) / page_kb;
    let out = &o["pushed_out"];
    // Pages each region had in swap when it was touched again.
    let read_back = [
        ("lazy", swapped(&out["lazy"])),
        ("populate", swapped(&out["populate"])),
        (
            "mlock",
            swapped(&out["mlock"]) + swapped(&o["munlock"]["pushed_out"]),
        ),
    ];
    let expected = read_back.map(|(r, n)| (r, pages + n));
    let pid = o["pids"][0].as_u64().map(|p| p as u32);
    let rows = run.faults(pid)["by_mapping"].clone();
    let hex = |v: &Value| {
        v.as_str()
            .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
    };
    // The sum of `field` over the rows overlapping region `r`; None where the rows or the
    // field are missing (not shown, or not measured).
    let traced = |r: &str, field: &str| -> Option<f64> {
        let (start, end) = (o["windows"][r][0].as_u64()?, o["windows"][r][1].as_u64()?);
        rows.as_array()?
            .iter()
            .filter(|row| {
                hex(&row["start"]).is_some_and(|s| s < end)
                    && hex(&row["end"]).is_some_and(|e| e > start)
            })
            .map(|row| row[field].as_f64())
            .sum()
    };
    v.push(per_region_check(
        "faults in each region: lazy, MAP_POPULATE, mlock (the tracer's mapping rows = a fault \
         per page at first touch, and per page smaps saw in swap)",
        &expected,
        |r| traced(r, "faults"),
        |want, got| got == want,
    ));
    // Each page read back from swap is a major fault of its own from zram (synchronous: no
    // readahead, no swap cache); from a disk, readahead's pages are swap-cache hits, minor.
    let zram = o["environment"]["swap"]
        .as_str()
        .is_some_and(|s| s.starts_with("/dev/zram"));
    v.push(per_region_check(
        "major faults in each region: lazy, MAP_POPULATE, mlock (the mapping rows' major \
         column = a fault per page smaps saw in swap, from zram; at most that from a disk)",
        &read_back,
        |r| traced(r, "majors"),
        |want, got| if zram { got == want } else { got <= want },
    ));
}

/// One check over the three regions: `expected` per region against `traced(region)` (None:
/// not shown), passing when `ok(expected, traced)` holds for each.
fn per_region_check(
    name: &str,
    expected: &[(&str, f64)],
    traced: impl Fn(&str) -> Option<f64>,
    ok: impl Fn(f64, f64) -> bool,
) -> Verdict {
    let traced: Vec<Option<f64>> = expected.iter().map(|(r, _)| traced(r)).collect();
    let words = |values: &mut dyn Iterator<Item = String>| values.collect::<Vec<_>>().join(", ");
    check(
        name,
        words(&mut expected.iter().map(|(r, n)| format!("{r} {n}"))),
        words(
            &mut expected.iter().zip(&traced).map(|((r, _), t)| {
                t.map_or_else(|| format!("{r} not shown"), |t| format!("{r} {t}"))
            }),
        ),
        expected
            .iter()
            .zip(&traced)
            .all(|((_, want), got)| got.is_some_and(|got| ok(*want, got))),
    )
}

/// secret-in-swap: the device searched for each region's key, with the positive control.
fn secret(o: &Value, v: &mut Vec<Verdict>) {
    let search = &o["swap_search"];
    let (unlocked, locked) = (
        f(&search["unlocked_key_pages"]),
        f(&search["locked_key_pages"]),
    );
    let page_kb = f(&o["page_size"]) / 1024.0;
    let swapped_pages = (f(&o["pushed_out"]["lazy"]["swap_kb"])
        + f(&o["pushed_out"]["populate"]["swap_kb"]))
        / page_kb;
    let measured = format!(
        "on {}: the unlocked regions' key on {unlocked} pages (smaps: {swapped_pages} pages \
         swapped), the locked region's key on {locked}; after munlock and pressure, on {}",
        o["environment"]["swap"]
            .as_str()
            .unwrap_or("the swap device"),
        f(&o["munlock"]["locked_key_pages"]),
    );
    if unlocked == 0.0 {
        v.push(super::Verdict {
            claim: "a secret in locked memory never reaches the swap device".into(),
            published: "000, introduction".into(),
            measured,
            verdict: "not checked",
            why: "the positive control failed: the unlocked key was not found either, so the \
                  search proves nothing (is zswap holding the pages?)"
                .into(),
        });
        return;
    }
    v.push(claim(
        "a secret in locked memory never reaches the swap device",
        "000, introduction",
        measured,
        locked == 0.0 && unlocked == swapped_pages,
        NOT_COVERED,
    ));
}

/// The tracer's fault counts of the experiment's process against the kernel's, as `wait4`
/// reported them at its exit.
fn tracer_majors(run: &ScenarioRun, v: &mut Vec<Verdict>) {
    let pid = run.own["pids"][0].as_u64().map(|p| p as u32);
    let traced = run.faults(pid);
    for (class, kernel) in [("major", "majflt"), ("minor", "minflt")] {
        let (traced, kernel) = (&traced[class], &run.own["faults_at_exit"][kernel]);
        v.push(check(
            &format!("{class} faults of the experiment's process (wait4 at its exit = tracer)"),
            kernel.to_string(),
            if traced.is_null() {
                "not traced".into()
            } else {
                traced.to_string()
            },
            traced.as_u64().is_some() && traced == kernel,
        ));
    }
}

/// The tracer's swap-ins and its time by cause against the kernel's own delay accounting of
/// the experiment's process (taskstats, read when it had exited: its whole life).
fn delay_accounting(run: &ScenarioRun, v: &mut Vec<Verdict>) {
    let o = &run.own;
    let kernel = &o["delays_at_exit"];
    let faults = run.faults(o["pids"][0].as_u64().map(|p| p as u32));
    if let Some(why) = kernel["not_measured"].as_str() {
        v.push(Verdict {
            claim: "the tracer's swap-ins and reclaim against the kernel's delay accounting".into(),
            published: String::new(),
            measured: String::new(),
            verdict: "not checked",
            why: format!("taskstats could not be read: {why}"),
        });
        return;
    }
    let latency = &faults["latency_ns"];
    let swap_ins = ["major_anon_swap_in", "major_shmem_swap_in"];
    // A kind with no fault has no row.
    let traced = |field: &str| -> Option<f64> {
        let sum = swap_ins.iter().map(|k| f(&latency[k][field])).sum();
        latency.is_object().then_some(sum)
    };
    let (count, ns) = (f(&kernel["swapin"]["count"]), f(&kernel["swapin"]["ns"]));
    // From 5.19 (taskstats version 11) the kernel times each read of a page from swap;
    // before, only a swap-in's waits for I/O, which zram's synchronous reads never make.
    let whole_reads = f(&kernel["version"]) >= 11.0;
    let zram = o["environment"]["swap"]
        .as_str()
        .is_some_and(|s| s.starts_with("/dev/zram"));
    let (traced_count, traced_ns) = (traced("count"), traced("total"));
    // Only a timed fault has a kind: a major fault counted without its start may be one more.
    let untimed = f(&faults["major"]) - f(&latency["major"]["count"]);
    v.push(check(
        &format!(
            "swap-ins of the experiment's process (taskstats swapin: {}; tracer: major faults \
             that were swap-ins, and {untimed} major faults counted without a latency, so of \
             no kind; the swap-ins' time containing the reads')",
            if whole_reads && zram {
                "each read from zram, one per swap-in fault, so the counts are equal"
            } else if whole_reads {
                "each read from swap, readahead's included, so at least the faults"
            } else {
                "waits for I/O only, so at most the faults"
            }
        ),
        format!("{count} swap-ins, {:.1} ms", ns / 1e6),
        match (traced_count, traced_ns) {
            (Some(c), Some(t)) => format!("{c} swap-in faults, {:.1} ms", t / 1e6),
            _ => "not traced".into(),
        },
        traced_count.zip(traced_ns).is_some_and(|(c, t)| {
            let counts = if whole_reads && zram {
                c <= count && count <= c + untimed
            } else if whole_reads {
                c <= count
            } else {
                count <= c + untimed
            };
            counts && (!whole_reads || ns <= t)
        }),
    ));
    let causes = &faults["time_by_cause"]["causes_ns"];
    let reclaim: Option<f64> = ["direct_reclaim", "memcg_reclaim"]
        .iter()
        .map(|k| causes[k].as_f64())
        .sum();
    let freepages = f(&kernel["freepages"]["ns"]);
    let (least, most) = RECLAIM_IN_FAULTS;
    v.push(check(
        &format!(
            "time in reclaim (taskstats freepages: every direct and memory-cgroup reclaim of \
             the process, {} of them; tracer: direct + memcg reclaim inside its timed faults, \
             {least}-{most} of the kernel's: the rest is reclaim outside them, for the pages \
             mlock and MAP_POPULATE populate among it)",
            kernel["freepages"]["count"]
        ),
        format!("{:.1} ms", freepages / 1e6),
        reclaim.map_or("not measured".into(), |r| {
            format!("{:.1} ms ({:.2})", r / 1e6, r / freepages.max(1.0))
        }),
        reclaim.is_some_and(|r| (freepages * least..=freepages * most).contains(&r)),
    ));
    let compact = kernel["compact"]["ns"].as_f64();
    let traced_compaction = causes["compaction"].as_f64();
    v.push(check(
        "time in direct compaction (taskstats compact, from 5.19; tracer: compaction inside \
         its timed faults, at most the kernel's)",
        compact.map_or("not accounted by this kernel".into(), |c| {
            format!("{:.1} ms", c / 1e6)
        }),
        traced_compaction.map_or("not measured".into(), |c| format!("{:.1} ms", c / 1e6)),
        traced_compaction.is_some_and(|t| compact.is_none_or(|c| t <= c * most)),
    ));
}

/// The share of the kernel's reclaim time the tracer's faults hold, at least and at most.
/// Measured (docs/reference.md): 0.87-0.96 on the host, 0.92-1.00 on the 6.x guests, 0.78 on
/// 5.10, whose remainder is not explained. Its window opens at the tracepoint before the
/// kernel's and holds its programs' own run: a little above 1 with every reclaim in a fault.
const RECLAIM_IN_FAULTS: (f64, f64) = (0.65, 1.05);
