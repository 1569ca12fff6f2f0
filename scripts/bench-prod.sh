#!/usr/bin/env bash
# Production benchmarks for BENCHMARKS.md (a benchmark, not a test): tracer CPU per million
# events, memory footprint, highest event rate without loss, and a soak with process churn.
# Run as root after `cargo build --release -p memlock-trace`:
#   scripts/bench-prod.sh            # SOAK_SECS=180 by default
# Figures are printed as `name value` lines for BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/memlock-trace}
SOAK_SECS=${SOAK_SECS:-180}
EVENTS=${EVENTS:-2000000}
WORK=$(mktemp -d /tmp/memlock-trace-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
HZ=$(getconf CLK_TCK)

# Distinct names so --comm selects exactly the benchmark's own processes.
cp "$BIN" "$WORK/mt-flood"
cp "$BIN" "$WORK/mt-churn"

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }          # utime + stime of the process
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
hwm_kb() { awk '/^VmHWM/ {print $2}' "/proc/$1/status"; }
# Kernel memory charged for the tracer's maps (the `memlock:` of each map fd).
map_kb() { cat /proc/"$1"/fdinfo/* 2>/dev/null | awk '/^memlock:/ {s += $2} END {print int(s / 1024)}'; }
json() { sed -n "s/.*\"$1\": *\([0-9.e+-]*\).*/\1/p" "$2" | head -1; }

start_tracer() { # args...; sets TPID, waits until attached
  rm -f "$WORK/tracer.err" "$WORK/tracer.out" # else the last run's "tracing" line would do
  "$BIN" --json "$@" >"$WORK/tracer.out" 2>"$WORK/tracer.err" &
  TPID=$!
  for _ in $(seq 500); do grep -qs "memlock-trace: tracing" "$WORK/tracer.err" && return; sleep 0.02; done
  cat "$WORK/tracer.err" >&2; exit 1
}
stop_tracer() { kill -INT "$TPID"; wait "$TPID" || true; }
summary_field() { tail -1 "$WORK/tracer.out" | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" | head -1; }
received_mlock() { tail -1 "$WORK/tracer.out" | grep -o '"mlock":{"count":[0-9]*' | awk -F: '{s += $3} END {print s + 0}'; }

echo "kernel $(uname -r), $(nproc) CPUs, $(date -u +%F)"

# 1. The flood untraced: the cost of the call itself.
"$WORK/mt-flood" workload flood --threads 1 --calls "$EVENTS" --report "$WORK/base.json"
base=$(json secs "$WORK/base.json")
echo "untraced_flood_secs $base"
echo "untraced_ns_per_call $(awk -v s="$base" -v n="$EVENTS" 'BEGIN {printf "%.0f", s * 1e9 / n}')"

# 2. Traced, one thread: tracer CPU per million events, memory, loss.
start_tracer --comm mt-flood
idle_rss=$(rss_kb "$TPID"); maps=$(map_kb "$TPID"); t0=$(ticks "$TPID")
"$WORK/mt-flood" workload flood --threads 1 --calls "$EVENTS" --report "$WORK/one.json"
sleep 1 # let it drain
t1=$(ticks "$TPID"); busy_rss=$(rss_kb "$TPID"); hwm=$(hwm_kb "$TPID")
stop_tracer
got=$(received_mlock); lost=$(summary_field dropped_events)
secs=$(json secs "$WORK/one.json")
echo "traced_flood_secs $secs"
echo "traced_ns_per_call $(awk -v s="$secs" -v n="$EVENTS" 'BEGIN {printf "%.0f", s * 1e9 / n}')"
echo "events_made $EVENTS received $got dropped $lost"
echo "tracer_cpu_ms_per_million_events $(awk -v t=$((t1 - t0)) -v hz="$HZ" -v n="$got" 'BEGIN {printf "%.0f", t / hz * 1000 * 1e6 / n}')"
echo "tracer_rss_kb idle $idle_rss after $busy_rss peak $hwm"
echo "tracer_map_memory_kb $maps"

# 3. Event rate against loss: more threads, more calls per second, until the ring overflows.
for threads in 1 2 4; do
  start_tracer --comm mt-flood
  per=$((EVENTS / threads))
  "$WORK/mt-flood" workload flood --threads "$threads" --calls "$per" --report "$WORK/r.json"
  sleep 1
  stop_tracer
  s=$(json secs "$WORK/r.json")
  echo "rate threads $threads calls $((per * threads)) per_sec $(awk -v s="$s" -v n=$((per * threads)) 'BEGIN {printf "%.0f", n / s}') received $(received_mlock) dropped $(summary_field dropped_events)"
done

# 4. Soak: both cores churning short-lived processes (each forks 20 children making 50
#    mlock calls), system-wide by comm, a bounded process table, scraped every 5 s.
start_tracer --comm mt-churn --max-processes 256 --prometheus 127.0.0.1:0
url=$(sed -n 's/.*serving Prometheus metrics on \(http[^ ]*\).*/\1/p' "$WORK/tracer.err")
end=$((SECONDS + SOAK_SECS))
for _ in 1 2; do
  ( while [ $SECONDS -lt $end ]; do "$WORK/mt-churn" workload children --count 20 --calls 50 --report /dev/null; done ) &
done
echo "soak ${SOAK_SECS}s: elapsed_s rss_kb cpu_ticks"
while [ $SECONDS -lt $end ]; do
  echo "soak_sample $((SOAK_SECS - end + SECONDS)) $(rss_kb "$TPID") $(ticks "$TPID")"
  curl -s "$url" >/dev/null || true
  sleep 10
done
wait $(jobs -p | grep -v "^$TPID$") 2>/dev/null || true
echo "soak_end_rss_kb $(rss_kb "$TPID") peak $(hwm_kb "$TPID")"
stop_tracer
echo "soak_processes_kept $(tail -1 "$WORK/tracer.out" | grep -o "\"pid\":" | wc -l) evicted $(summary_field evicted_processes) dropped $(summary_field dropped_events)"
