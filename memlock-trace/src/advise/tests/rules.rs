//! What each kind of advice needs to be drawn, and what keeps it from being drawn.

use super::{MIB, mapping, sixty_four_mib_under_eight, table};
use crate::advise::{
    rules::{ApplyStep, Kind, Verdict, advise},
    table::MappingFigures,
};

#[test]
fn a_table_faulting_after_start_up_is_locked_within_the_limit() {
    let advice = advise(&sixty_four_mib_under_eight(true));
    assert_eq!(advice[0].kind, Kind::Lock, "{advice:?}");
    assert_eq!(advice[0].pinned_bytes, 64 * MIB);
    assert_eq!(advice[0].faults_removed, 16384);
    assert_eq!(
        advice[0].apply,
        Some(ApplyStep::Preload(format!("lock:anon:{}", 64 * MIB)))
    );
}

#[test]
fn over_the_limit_it_is_populated_and_the_limit_named() {
    let advice = advise(&sixty_four_mib_under_eight(false));
    assert_eq!(advice[0].kind, Kind::Populate, "{advice:?}");
    let refused = advice.iter().find(|a| a.kind == Kind::OverLimit).unwrap();
    assert_eq!(refused.verdict, Verdict::DoNot);
    assert!(
        refused
            .how
            .contains("RLIMIT_MEMLOCK of at least 64 MiB (RLIMIT_MEMLOCK 8 MiB now"),
        "{}",
        refused.how
    );
}

#[test]
fn memory_faulted_many_times_its_size_gets_the_allocator_setting_not_a_lock() {
    let block = 64 * MIB + 4096;
    let mut m = mapping("anonymous", block, 0, 10 * (block / 4096));
    m.lifetimes = 5;
    let advice = advise(&table(vec![m.clone()], 8 * MIB, true));
    assert_eq!(advice.len(), 1, "{advice:?}");
    assert_eq!(advice[0].kind, Kind::Allocator);
    assert_eq!(
        advice[0].apply,
        Some(ApplyStep::Tunable(
            "glibc.malloc.mmap_threshold=134217728:glibc.malloc.trim_threshold=268435456".into()
        ))
    );
    // Another allocator: no glibc tunable to give, and nothing to apply.
    let mut t = table(vec![m], 8 * MIB, true);
    t.glibc_malloc = false;
    let advice = advise(&t);
    assert_eq!(advice[0].verdict, Verdict::CannotHelp);
    assert_eq!(advice[0].apply, None);
}

#[test]
fn start_up_only_memory_is_not_to_be_locked_and_few_faults_are_no_advice() {
    let t = table(
        vec![
            mapping("/usr/lib/libbig.so", 4 * MIB, 1024, 0),
            mapping("anonymous", MIB, 0, 10),
        ],
        8 * MIB,
        true,
    );
    let advice = advise(&t);
    assert_eq!(advice.len(), 1, "{advice:?}");
    assert_eq!(advice[0].kind, Kind::FaultedOnce);
    assert_eq!(advice[0].verdict, Verdict::DoNot);
}

#[test]
fn the_heap_is_advised_but_not_applied_and_threads_get_the_stack_warning() {
    let mut t = table(vec![mapping("[heap]", 16 * MIB, 0, 4096)], 64 * MIB, false);
    t.limits.threads_max = 8;
    let advice = advise(&t);
    assert_eq!(advice[0].kind, Kind::Lock);
    assert_eq!(advice[0].apply, None);
    assert!(
        advice[0].how.contains("--apply cannot"),
        "{}",
        advice[0].how
    );
    assert!(advice.iter().any(|a| a.kind == Kind::ThreadStacks));
}

#[test]
fn stacks_short_lived_threads_ran_on_are_never_locked_and_counted_in_the_warning() {
    // Eight 2 MiB thread stacks the kernel saw threads run on, none of them in a sample (the
    // threads came and went between two): one thread at most was seen at once.
    let mut stacks: Vec<MappingFigures> = (0..8u64)
        .map(|i| {
            let mut m = mapping("anonymous", 2 * MIB, 0, 64);
            m.start += i * 3 * MIB;
            m.end = m.start + 2 * MIB;
            m.resident_bytes = None;
            // The kernel told 7 of the 8 apart; the eighth's lookups met a busy mmap lock.
            m.stack = i < 7;
            m
        })
        .collect();
    crate::advise::table::mark_stack_sized(&mut stacks);
    let advice = advise(&table(stacks, 64 * MIB, true));
    assert!(
        advice.iter().all(|a| a.verdict != Verdict::Do),
        "{advice:?}"
    );
    let warning = advice
        .iter()
        .find(|a| a.kind == Kind::ThreadStacks)
        .unwrap();
    assert_eq!(
        warning.what,
        "8 thread stacks seen faulting (threads came and went between the samples, which saw \
         at most 1 at once), 16 MiB reserved"
    );
}

#[test]
fn mappings_over_the_limit_are_one_do_not_naming_the_limit_all_need() {
    let mut big = mapping("anonymous", 64 * MIB, 0, 16384);
    big.start += 1 << 32;
    big.end += 1 << 32;
    let t = table(
        vec![big, mapping("anonymous", 16 * MIB, 0, 4096)],
        8 * MIB,
        false,
    );
    let advice = advise(&t);
    let refused: Vec<_> = advice
        .iter()
        .filter(|a| a.kind == Kind::OverLimit)
        .collect();
    assert_eq!(refused.len(), 1, "{advice:?}");
    assert!(
        refused[0].what.starts_with("2 mappings"),
        "{}",
        refused[0].what
    );
    assert!(
        refused[0]
            .how
            .contains("at least 80 MiB (RLIMIT_MEMLOCK 8 MiB now"),
        "{}",
        refused[0].how
    );
}

#[test]
fn a_mapping_malloc_made_is_applied_by_its_blocks_sizes_one_rule_each() {
    // Two merged runs of 1 MiB slabs (1 MiB + malloc's header: two pages over) and a table
    // of 512 KiB, as the preload library logged them in the watching run.
    let mut slabs = mapping("anonymous", 48 * MIB, 0, 12_000);
    slabs.start = 0x7f10_0000_0000;
    slabs.end = slabs.start + 48 * MIB;
    let mut more = mapping("anonymous", 16 * MIB, 0, 4_000);
    more.start = 0x7f20_0000_0000;
    more.end = more.start + 16 * MIB;
    let mut t = table(vec![slabs, more], 8 * MIB, false);
    t.preload_log = (0..48)
        .map(|i| {
            format!(
                "alloc 0x{:x} 1048576",
                0x7f10_0000_0010u64 + i * (MIB + 4096)
            )
        })
        .chain(["alloc 0x7f20_0000_0010 1048576".replace('_', "")])
        .chain(["alloc 0x7f30_0000_0010 524288".replace('_', "")])
        .collect();
    let advice = advise(&t);
    let done: Vec<_> = advice.iter().filter(|a| a.verdict == Verdict::Do).collect();
    assert_eq!(done.len(), 2, "{advice:?}");
    for a in &done {
        assert_eq!(a.kind, Kind::Populate, "over 8 MiB: {a:?}");
        assert_eq!(
            a.apply,
            Some(ApplyStep::Preload("populate:alloc:1048576".into())),
            "{a:?}"
        );
    }
    assert!(
        done[0]
            .how
            .contains("made it with 48 malloc blocks of 1 MiB (seen"),
        "{}",
        done[0].how
    );
    let steps: Vec<ApplyStep> = done.iter().filter_map(|a| a.apply.clone()).collect();
    assert_eq!(
        crate::advise::apply::preload_rules(&steps),
        ["populate:alloc:1048576"],
        "one rule for both"
    );
    // A size one mapping locks and another populates: populated, the limit was weighed
    // per mapping.
    let mixed = [
        ApplyStep::Preload("lock:alloc:1048576;lock:anon:8192".into()),
        ApplyStep::Preload("populate:alloc:1048576".into()),
    ];
    assert_eq!(
        crate::advise::apply::preload_rules(&mixed),
        ["populate:alloc:1048576", "lock:anon:8192"]
    );
}
