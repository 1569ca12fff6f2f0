#!/usr/bin/env bash
# The cost of a session (a benchmark, not a test): wall time of tracing one short command end
# to end, memlock-trace against bpftrace doing the same job (the command's page faults), and
# how promptly --duration and SIGTERM end a system-wide session. Run as root after
# `cargo build --release -p memlock-trace`:
#   scripts/bench-session.sh            # RUNS=11 by default; BASELINE_BIN=another build, timed beside
# GAP (2.5 s by default) separates the runs: a session's hooks are released by a child after it
# exits (1.5 s of grace periods under the kernel's event_mutex), and a start within that time
# waits for the mutex (any tool's, bpftrace's too), which would time the release, not the start.
# Method: the tools alternate run by run (drift on a shared machine hits both alike); the
# median wall time of each is reported, with the ratio to bpftrace's. Figures are printed as
# `name value` lines for BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/memlock-trace}
RUNS=${RUNS:-11}
CMD=${CMD:-/bin/true}
GAP=${GAP:-2.5}
WORK=$(mktemp -d /tmp/memlock-trace-session.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
command -v bpftrace >/dev/null || { echo "bpftrace is not installed (apt-get install bpftrace)" >&2; exit 1; }

now() { date +%s.%N; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# Wall seconds of one run of "$@", output discarded (it is checked once below).
wall() { local t0; t0=$(now); "$@" >/dev/null 2>&1; awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.3f\n", b - a}'; }

# The same job in bpftrace: count the command's user page faults (the tracepoint memlock-trace's
# tracepoint hook set starts from), printed at exit.
BPFTRACE_PROG='tracepoint:exceptions:page_fault_user /pid == cpid/ { @faults = count(); }'
run_bpftrace() { bpftrace -e "$BPFTRACE_PROG" -c "$CMD"; }
run_default() { "$BIN" -q -- "$CMD"; }
run_no_faults() { "$BIN" -q --fault-hooks off -- "$CMD"; }
run_baseline() { "$BASELINE_BIN" -q -- "$CMD"; }

# Each tool's output once, so that a tool that fails is not timed as a fast one.
run_bpftrace | grep -q '@faults: [0-9]' || { echo "bpftrace counted nothing" >&2; exit 1; }
run_default | grep -q 'page faults: [0-9]' || { echo "memlock-trace counted no faults" >&2; exit 1; }

echo "kernel $(uname -r), $(nproc) CPUs, $(date -u +%F), load $(cut -d' ' -f1-3 /proc/loadavg), $RUNS runs of $CMD"
: >"$WORK/bpftrace"; : >"$WORK/default"; : >"$WORK/off"; : >"$WORK/base"
for _ in $(seq "$RUNS"); do
  wall run_bpftrace >>"$WORK/bpftrace"; sleep "$GAP"
  wall run_default >>"$WORK/default"; sleep "$GAP"
  wall run_no_faults >>"$WORK/off"; sleep "$GAP"
  if [ -n "${BASELINE_BIN:-}" ]; then wall run_baseline >>"$WORK/base"; sleep "$GAP"; fi
done
b=$(median <"$WORK/bpftrace"); d=$(median <"$WORK/default"); o=$(median <"$WORK/off")
ratio() { awk -v a="$1" -v b="$b" 'BEGIN {printf "%.2f", a / b}'; }
echo "bpftrace_wall_s $b"
echo "memlock_trace_wall_s $d ratio_to_bpftrace $(ratio "$d")"
echo "memlock_trace_fault_hooks_off_wall_s $o ratio_to_bpftrace $(ratio "$o")"
if [ -n "${BASELINE_BIN:-}" ]; then
  base=$(median <"$WORK/base")
  echo "baseline_wall_s $base ratio_to_bpftrace $(ratio "$base")"
fi

# System-wide sessions: from the "tracing" line to the process gone.
start_tracer() { # args...; sets TPID once attached (TRACER_BIN: another build)
  "${TRACER_BIN:-$BIN}" --json "$@" >"$WORK/out" 2>"$WORK/err" &
  TPID=$!
  for _ in $(seq 3000); do grep -qs "memlock-trace: tracing" "$WORK/err" && return; sleep 0.01; done
  cat "$WORK/err" >&2; exit 1
}
: >"$WORK/term"; : >"$WORK/duration"
for _ in $(seq "$RUNS"); do
  start_tracer
  sleep 0.5
  t0=$(now); kill -TERM "$TPID"; wait "$TPID" || true
  awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.3f\n", b - a}' >>"$WORK/term"
  grep -q '"type":"summary"' "$WORK/out" || { echo "no summary after SIGTERM" >&2; exit 1; }
  start_tracer -d 1
  t0=$(now); wait "$TPID" || true
  awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.3f\n", b - a - 1}' >>"$WORK/duration"
  grep -q '"type":"summary"' "$WORK/out" || { echo "no summary after --duration" >&2; exit 1; }
done
echo "sigterm_to_exit_s median $(median <"$WORK/term") max $(sort -g "$WORK/term" | tail -1)"
echo "duration_1s_overshoot_s median $(median <"$WORK/duration") max $(sort -g "$WORK/duration" | tail -1)"

# What a session costs every system call of the machine while it runs: the syscall programs
# sit on the raw sys_enter/sys_exit tracepoints and run at every call, returning at once for
# calls they do not handle. `perf bench syscall basic` (getppid in a loop) untraced, then
# beside a system-wide session, alternating; BASELINE_BIN (another build) adds a third column.
command -v perf >/dev/null || { echo "perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
syscall_ns() { perf bench syscall basic 2>/dev/null | awk '/usecs\/op/ {printf "%.1f\n", $1 * 1000}'; }
beside() { # bin: ns per getppid while a system-wide session of bin runs
  TRACER_BIN=$1 start_tracer -o /dev/null
  syscall_ns
  kill -TERM "$TPID"; wait "$TPID" || true
}
: >"$WORK/untraced"; : >"$WORK/traced"; : >"$WORK/baseline"
for _ in $(seq "$RUNS"); do
  syscall_ns >>"$WORK/untraced"
  beside "$BIN" >>"$WORK/traced"
  if [ -n "${BASELINE_BIN:-}" ]; then beside "$BASELINE_BIN" >>"$WORK/baseline"; fi
done
u=$(median <"$WORK/untraced"); t=$(median <"$WORK/traced")
echo "getppid_ns untraced $u traced $t ratio $(awk -v a="$t" -v b="$u" 'BEGIN {printf "%.2f", a / b}')"
if [ -n "${BASELINE_BIN:-}" ]; then
  b=$(median <"$WORK/baseline")
  echo "getppid_ns baseline $b ratio $(awk -v a="$b" -v c="$u" 'BEGIN {printf "%.2f", a / c}')"
fi
