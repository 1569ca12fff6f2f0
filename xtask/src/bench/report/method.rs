//! The report's heading and its method: what was run, on what machine, and how the figures
//! are taken, for the reader to judge the tables by.

use std::fmt::Write as _;

use super::{super::Args, Environment};

/// The section's heading, the run's command line and machine, and the method.
pub(super) fn heading_and_method(out: &mut String, args: &Args, pages: usize, env: &Environment) {
    let machine = &env.machine;
    let cpus = machine.cpus;
    let _ = writeln!(
        out,
        "## Page faults: the cost of tracing them (`cargo xtask bench`)\n"
    );
    let _ = writeln!(
        out,
        "Produced by `cargo xtask bench --mib {} --runs {} --repeats {}` on kernel {}, {cpus} CPUs; \
         transparent huge pages `{}` (the region is `MADV_NOHUGEPAGE` besides). \
         Load average before / after: {} / {}.\n",
        args.mib,
        args.runs,
        args.repeats,
        machine.kernel,
        env.thp,
        machine.load_before,
        machine.load_after
    );
    let _ = writeln!(out, "### Method\n");
    let _ = writeln!(
        out,
        "- Workload: `memlock-trace workload faults`, command `touch {pages}`: mmap {mib} MiB \
         anonymous, write one byte per 4 KiB page ({pages} minor faults), munmap.\n\
         - The figure compared is the workload's own CPU time for the command \
         (`CLOCK_PROCESS_CPUTIME_ID` around it) divided by the faults the kernel counted for the \
         process in the window (`/proc/PID/stat` minflt+majflt). CPU time leaves out the time \
         other processes held the CPU, the main noise on a shared 2-CPU machine; in-kernel \
         tracing costs are charged to the faulting task, so they are in it. Wall time is shown \
         too (it also carries what a tracer's user space takes from the machine).\n\
         - Each run is a fresh workload process, warmed with a 1 MiB touch, that runs the \
         command {repeats} times in the traced window; the fastest of them is the run's figure \
         (interference only ever adds time; single runs swung by +-15% on this machine). The tracer attaches \
         to it (`-p PID`; ready at its \"tracing\" line; bpftrace: at the first tick of an \
         interval probe attached after the others) after the warm-up, and stops (SIGINT) after \
         the run, so its count must equal the kernel's for the window: \"faults lost\".\n\
         - Modes are interleaved within each of the {runs} rounds, so drift hits them alike; \
         the tables give medians (min and max beside). \"Added\" is the median over rounds of \
         (mode - untraced) in the same round; the min column shows the same story with the \
         least interference.\n\
         - memlock-trace runs with `--fault-hooks tracepoint`, the set this kernel allows \
         (fentry: EPERM, no kprobes): with `-p` the `PAGE_FAULTS` software perf event on \
         each of the target's threads (period 1, counted at the top of \
         `do_user_addr_fault()`) marks the start, the `PAGE_FAULTS_MIN/MAJ` events on the \
         same threads (period 1, or N with `--latency-sample N`) the completion; the \
         \"start from system-wide tp_btf\" rows take the start from \
         `exceptions:page_fault_{{user,kernel}}` instead, the other design (hidden \
         flag `--tracepoint-start`), and so do the classic, system-wide floor and bpftrace \
         rows (the system-wide floor and bpftrace rows with completion events one per CPU); \
         the populating-syscall and `signal_generate` tracepoints are attached too. It attaches \
         the start tracepoints BTF-typed (tp_btf) where the kernel allows, which bpftrace 0.17 \
         cannot; the \"classic tracepoints\" row attaches them as bpftrace does \
         (hidden flag `--classic-tracepoints`), for a like-for-like comparison.\n\
         - `--count-only` on specific targets uses counting perf events on the targets' threads \
         (no BPF program per fault; see `memlock-trace/src/faults/counting.rs`).\n\
         - bpftrace ({bpftrace}) does the default mode's job on the same hooks: per-process \
         minor/major counts and latency histograms from fault start to accounting (the script \
         is `BPFTRACE_SCRIPT` in `xtask/src/bench/measure.rs`).\n\
         - `--events` additionally streams every fault through the ring buffer to user space \
         (JSON lines on a pipe): the streaming design, measured rather than assumed.\n\
         - The two system-wide floor rows attach the per-fault hooks of system-wide tracing \
         (tp_btf start, perf completion on every CPU) with programs that return at once \
         (hidden flag `--bench-floor empty`), or that only read the clock at each end \
         (`--bench-floor clock`): what the hooks themselves cost any tool, and what timing \
         faults on them costs before any filtering or counting. The two per-thread floor rows \
         (`--bench-floor per-thread`) open the events `-p` uses on the target's threads \
         (`PAGE_FAULTS` at period 1, `PAGE_FAULTS_MIN/MAJ` at period 1 or 32) with programs \
         that return at once: the floor under the default and sampled modes as they run \
         here.\n\
         - `--latency-sample N` binds the completion events to the target's threads with \
         sample period N (their BPF program runs once per N faults); the events' own counts, \
         read by the tracer, keep the fault counts exact; the start hook records every target \
         fault's start (and its mapping), and the sampled completion pairs with it. With `-p` \
         every latency mode binds its completion events to the target's threads, not to every \
         CPU.\n\
         - \"Non-target\" rows: the same workload, untraced itself, while the tracer follows \
         another process (a `sleep`) with `-p`: what every other process on the machine pays.\n\
         - {placement}\n",
        placement = placement(cpus),
        mib = args.mib,
        runs = args.runs,
        repeats = args.repeats,
        bpftrace = machine.bpftrace_version,
    );
}

/// Where the workload and the tracer ran.
fn placement(cpus: usize) -> String {
    if cpus >= 2 {
        format!(
            "Placement: in the rounds, the workload runs alone on CPU {} and the tracer's \
             user space (memlock-trace or bpftrace) on CPU 0 (`taskset`), so neither \
             takes the other's CPU or caches mid-run; the max-rate run is not pinned.",
            cpus - 1
        )
    } else {
        "Placement: one CPU, nothing pinned.".to_string()
    }
}
