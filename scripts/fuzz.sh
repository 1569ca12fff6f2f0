#!/usr/bin/env bash
# Fuzzing (not a test: bounded, run by hand or from a nightly job): each target in fuzz/
# (smaps/maps parsing, ring-buffer record decoding, the escaping of names, cgroup paths, the
# --web-config file) runs under libFuzzer for FUZZ_SECS seconds; a panic stops it and leaves the input in
# fuzz/artifacts/TARGET/. Stable Rust is enough: the coverage instrumentation is the one
# cargo-fuzz passes (without AddressSanitizer, which needs nightly; `cargo +nightly fuzz run
# TARGET` adds it). A separate target directory keeps the instrumented build apart.
#   scripts/fuzz.sh                  # every target, FUZZ_SECS=30 each
#   FUZZ_SECS=600 scripts/fuzz.sh decode
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
FUZZ_SECS=${FUZZ_SECS:-30}
TARGET=x86_64-unknown-linux-gnu
TARGET_DIR=../target/fuzz
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# --target keeps RUSTFLAGS off build scripts (and the eBPF object's own build).
cargo build --release --locked --target "$TARGET" --target-dir "$TARGET_DIR" --bins
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=(smaps decode escape cgroup web_config); fi
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  echo "fuzzing $t for ${FUZZ_SECS}s"
  log="artifacts/$t/last-run.log"
  status=0
  "$TARGET_DIR/$TARGET/release/$t" -max_total_time="$FUZZ_SECS" -max_len=65536 \
    -artifact_prefix="artifacts/$t/" "corpus/$t" "seeds/$t" >"$log" 2>&1 || status=$?
  # libFuzzer's last progress line (runs, coverage, corpus), or the crash and its input.
  grep -E "^#[0-9]+[[:space:]]+DONE|^Done|ERROR|panicked|Test unit written" "$log" || true
  if [ "$status" -ne 0 ]; then
    echo "fuzz target $t failed (exit $status): see $log"
    exit "$status"
  fi
done
