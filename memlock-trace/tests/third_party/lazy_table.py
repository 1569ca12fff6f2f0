"""A program with a lazily touched table: it maps SIZE bytes (shared anonymous memory, through
the mmap module), lets its start-up end, then writes one byte per page (or per STRIDE pages)
inside a timed phase.
It appends its own account of that phase to REPORT as one JSON line: the minor faults
getrusage and /proc/self/stat counted, and the time it took; then holds the table HOLD
seconds (0 unless given), as a server would, so that a sampler's last look sees it full.

    python3 lazy_table.py REPORT SIZE [STRIDE [HOLD]]
"""

import json
import mmap
import resource
import sys
import time


def stat_minflt():
    with open("/proc/self/stat") as f:
        text = f.read()
    # Field 10 (minflt), counted after the comm's closing parenthesis (field 2).
    return int(text[text.rindex(")") + 2 :].split()[7])


report, size = sys.argv[1], int(sys.argv[2])
stride = int(sys.argv[3]) if len(sys.argv) > 3 else 1
hold = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
table = mmap.mmap(-1, size)
time.sleep(0.5)
rusage0, stat0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, stat_minflt(), time.perf_counter()
for offset in range(0, size, mmap.PAGESIZE * stride):
    table[offset] = 1
t1, stat1, rusage1 = time.perf_counter(), stat_minflt(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
with open(report, "a") as f:
    f.write(json.dumps({
        "pages": size // mmap.PAGESIZE,
        "touched": len(range(0, size, mmap.PAGESIZE * stride)),
        "timed_minflt": rusage1 - rusage0,
        "timed_stat_minflt": stat1 - stat0,
        "timed_ms": (t1 - t0) * 1e3,
    }) + "\n")
time.sleep(hold)
