//! Memory handed back to the kernel and faulted in again: locking cannot help it (a lock
//! ends with the mapping); the allocator's setting that keeps it can.

use super::{
    Advice, ApplyStep, Kind, MIN_STEADY_FAULTS, MappingFigures, PAGE_SIZE, Table, Verdict, count,
    range, size,
};

/// Faults per page above which a region was given back and faulted in again: a private
/// page faults at most twice (a read of the zero page, then a write) while it stays mapped.
const REFAULTS_PER_PAGE: f64 = 2.0;

/// Anonymous memory that faulted more than its pages can while mapped: handed back to the
/// kernel (munmap, a shrinking brk, MADV_DONTNEED) and faulted in again.
pub(super) fn refaulted(m: &MappingFigures) -> bool {
    m.anonymous()
        && !m.shared_anonymous()
        && m.faults_after >= MIN_STEADY_FAULTS
        && (m.faults() as f64 > REFAULTS_PER_PAGE * m.pages() as f64
            || (m.lifetimes >= 2 && m.faults() > m.pages()))
}

pub(super) fn allocator(table: &Table, m: &MappingFigures) -> Vec<Advice> {
    let rounds = m.faults() as f64 / m.pages() as f64;
    let seen_again = if m.lifetimes >= 2 {
        format!(", and was seen mapped {} times at this place", m.lifetimes)
    } else {
        String::new()
    };
    let what = format!(
        "{} {} ({}) faulted {} times, {rounds:.1} times its {} pages{seen_again}: the \
         allocator gives it back to the kernel and faults it in again. Locking cannot help: \
         a lock ends with the mapping, and mlockall(MCL_FUTURE) would only move each \
         round's faults into the mmap call.",
        m.mapping,
        range(m),
        size(m.size_bytes),
        count(m.faults()),
        count(m.pages())
    );
    // Keeping one block of this size: everything after its first round is saved.
    let kept = m.faults_after.saturating_sub(m.pages());
    let saved = (m.fault_ns_after as f64 * kept as f64 / m.faults_after.max(1) as f64) as u64;
    if !table.glibc_malloc {
        let how = "the program does not allocate with glibc's malloc: keep freed memory with \
                   its own allocator's setting (jemalloc: retain, dirty_decay_ms; tcmalloc: \
                   release rate)"
            .to_string();
        return vec![Advice::new(Verdict::CannotHelp, Kind::Allocator, what, how).on(m)];
    }
    let block = m.size_bytes;
    let (tunable, how) = if m.mapping == "[heap]" {
        let trim = block.next_power_of_two() * 2;
        (
            format!("glibc.malloc.trim_threshold={trim}"),
            format!(
                "keep the heap's top instead of trimming it: GLIBC_TUNABLES=glibc.malloc.\
                 trim_threshold={trim} (or mallopt(M_TRIM_THRESHOLD, {trim}))"
            ),
        )
    } else {
        // Above the block, so malloc serves it from the heap; trimming kept above it too.
        let threshold = (block + PAGE_SIZE).next_power_of_two();
        let trim = threshold * 2;
        (
            format!("glibc.malloc.mmap_threshold={threshold}:glibc.malloc.trim_threshold={trim}"),
            format!(
                "serve it from the heap and keep it there: GLIBC_TUNABLES=glibc.malloc.\
                 mmap_threshold={threshold}:glibc.malloc.trim_threshold={trim} (or \
                 mallopt(M_MMAP_THRESHOLD, {threshold}) and mallopt(M_TRIM_THRESHOLD, {trim})); \
                 glibc's own threshold stops growing at 32 MiB"
            ),
        )
    };
    let mut a = Advice::new(Verdict::Do, Kind::Allocator, what, how)
        .on(m)
        .saving(block, saved, kept);
    a.apply = Some(ApplyStep::Tunable(tunable));
    vec![a]
}
