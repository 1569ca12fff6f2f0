//! One measured window of `faults.rs`: a command run between two blocked states of the
//! workload, the tracer's figures for it compared with the kernel's own `/proc/PID/stat`
//! deltas, and the faults it timed compared with what the recording times.

use std::time::Duration;

use memlock_trace::{
    faults::{FaultSummary, HookSet, mappings::MappingFaults},
    procfs::MappingCache,
    tracer::Tracer,
};

use super::{
    Recording, SAMPLE,
    harness::{Delta, Workload, delta, report, summary},
};

/// The workload traced by a tracer forced to one hook set, measured window by window.
pub(super) struct Windows<'a> {
    pub(super) tracer: &'a Tracer,
    child: Workload,
    pid: u32,
    pub(super) set: HookSet,
    pub(super) recording: Recording,
}

impl<'a> Windows<'a> {
    pub(super) fn new(
        tracer: &'a Tracer,
        child: Workload,
        set: HookSet,
        recording: Recording,
    ) -> Self {
        let pid = child.pid();
        Self {
            tracer,
            child,
            pid,
            set,
            recording,
        }
    }

    /// Runs `command` in one window, checks the tracer's counts against the kernel's, and
    /// returns them with the address the command used and the faults per mapping.
    pub(super) fn run(&mut self, command: &str) -> (Delta, usize, Vec<MappingFaults>) {
        let (before, after, addr, proc_delta) = self.measure(command);
        let d = delta(&before, &after);
        let by_mapping = by_mapping(&before, &after);
        self.check_against_the_kernel(command, &d, &after, proc_delta);
        eprintln!("{:>10} {command:<40} {d:?}", self.set.name());
        (d, addr, by_mapping)
    }

    /// The tracer's summaries before and after `command`, the address it used, and the
    /// kernel's (minor, major) faults in between.
    fn measure(&mut self, command: &str) -> (FaultSummary, FaultSummary, usize, (u64, u64)) {
        let proc_before = self.child.proc_faults();
        let report_before = report(self.tracer);
        let addr = self.child.run(command);
        let proc_after = self.child.proc_faults();
        let report_after = report(self.tracer);
        // Both sides attributed to the mappings of now: addresses get reused by new mappings.
        let mut mappings = MappingCache::default();
        mappings.refresh(self.pid, Duration::ZERO);
        let before = summary(self.tracer, &report_before, &mut mappings, self.pid);
        let after = summary(self.tracer, &report_after, &mut mappings, self.pid);
        let proc_delta = (proc_after.0 - proc_before.0, proc_after.1 - proc_before.1);
        (before, after, addr, proc_delta)
    }

    fn check_against_the_kernel(
        &self,
        command: &str,
        d: &Delta,
        after: &FaultSummary,
        proc_delta: (u64, u64),
    ) {
        let pid = self.pid;
        // The kernel's count, exactly.
        assert_eq!(
            (d.minor, d.major),
            proc_delta,
            "`{command}` with {} hooks: tracer (minor, major) vs /proc/{pid}/stat; {d:?}",
            self.set.name()
        );
        assert_eq!(
            d.user + d.populated,
            d.minor + d.major,
            "`{command}`: {d:?}"
        );
        // Per thread: the child is single-threaded, so its one thread holds everything.
        if self.recording == Recording::PerThread {
            assert_eq!(after.threads.len(), 1, "{:?}", after.threads);
            assert_eq!(after.threads[0].tid, pid);
            assert_eq!(
                (after.threads[0].faults.minor, after.threads[0].faults.major),
                (after.minor, after.major)
            );
        }
    }

    /// Whether the hooks see the VMA of each fault (all but the tracepoint set).
    pub(super) fn vma_hooks(&self) -> bool {
        self.set != HookSet::Tracepoint
    }

    /// A VMA count as the hooks give it: `n` where they see the VMA, else none.
    pub(super) fn zero_if_vma(&self, n: u64) -> Option<u64> {
        self.vma_hooks().then_some(n)
    }

    pub(super) fn count_only(&self) -> bool {
        self.recording == Recording::CountOnly
    }

    /// Faults timed of the n of `class` in a window: all of them, none in count-only mode,
    /// one in SAMPLE when sampled: n / SAMPLE rounded down or up, whatever the phase of the
    /// thread's period, so exactly n / SAMPLE for a multiple of SAMPLE (a sample whose start
    /// was not seen would be unmatched instead; the touch window checks there is none).
    pub(super) fn check_timed(&self, d: &Delta, class: &str, n: u64) {
        let period = u64::from(SAMPLE);
        let t = d.timed.get(class).copied();
        if self.count_only() {
            assert_eq!(t, None, "{class}: {d:?}");
        } else if self.recording == Recording::Sampled {
            let t = t.unwrap_or(0) + d.latency_unmatched;
            assert!(
                (n / period..=n.div_ceil(period)).contains(&t),
                "{class}: {t} of {n} timed, period {period}: {d:?}"
            );
        } else {
            assert_eq!(t, Some(n), "{class}: {d:?}");
        }
    }
}

/// The faults of each mapping of `after` taken since `before`.
fn by_mapping(before: &FaultSummary, after: &FaultSummary) -> Vec<MappingFaults> {
    after
        .by_mapping
        .iter()
        .map(|m| {
            let old = before
                .by_mapping
                .iter()
                .find(|b| b.start == m.start)
                .map_or(0, |b| b.faults);
            MappingFaults {
                faults: m.faults - old,
                ..m.clone()
            }
        })
        .collect()
}
