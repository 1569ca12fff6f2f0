#!/usr/bin/env bash
# Soak (a benchmark, not a test): the tracer runs system-wide while both CPUs take page
# faults without pause (two loops of short-lived first-touch processes, so processes churn
# too), and its resident memory is sampled. Run as root after
# `cargo build --release -p memlock-trace`:
#   scripts/soak-faults.sh            # SOAK_SECS=600 by default
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/memlock-trace}
SOAK_SECS=${SOAK_SECS:-600}
WORK=$(mktemp -d /tmp/memlock-trace-soak.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT

"$BIN" --json >"$WORK/tracer.out" 2>"$WORK/tracer.err" &
TPID=$!
until grep -qs "memlock-trace: tracing" "$WORK/tracer.err"; do sleep 0.1; done

faulter() { # one CPU's worth of first touches: 64 MiB per process, a new process each time
  while :; do "$BIN" scenario first-touch --variant lazy --touch-mib 64 --runs 4 >/dev/null; done
}
faulter & faulter &
rss() { awk '/^VmRSS/ {print $2}' "/proc/$TPID/status"; }
echo "kernel $(uname -r), $(nproc) CPUs, $(date -u +%F), ${SOAK_SECS}s"
echo "elapsed_s tracer_rss_kb faults_per_s(system)"
start=$SECONDS
prev=$(awk '/^pgfault/ {print $2}' /proc/vmstat)
while (( SECONDS - start < SOAK_SECS )); do
  sleep 30
  now=$(awk '/^pgfault/ {print $2}' /proc/vmstat)
  echo "$((SECONDS - start)) $(rss) $(( (now - prev) / 30 ))"
  prev=$now
done
echo "peak_rss_kb $(awk '/^VmHWM/ {print $2}' "/proc/$TPID/status")"
kill %2 %3 2>/dev/null || true
kill -INT "$TPID"; wait "$TPID" || true
tail -1 "$WORK/tracer.out" | grep -o '"dropped_events":[0-9]*' | head -1
tail -1 "$WORK/tracer.out" | grep -o '"fault_health":{[^}]*}'
