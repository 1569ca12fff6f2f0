"""A program whose allocator gives a large block back to the kernel every round: ROUNDS times,
a bytearray of MIB MiB is made (glibc's malloc maps it: above its 32 MiB threshold cap) and
dropped (unmapped again). It appends its own account of the rounds to REPORT as one JSON
line: the minor faults getrusage and /proc/self/stat counted, and the time they took.

    python3 churn.py REPORT ROUNDS MIB
"""

import json
import resource
import sys
import time


def stat_minflt():
    with open("/proc/self/stat") as f:
        text = f.read()
    return int(text[text.rindex(")") + 2 :].split()[7])


report, rounds, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
time.sleep(0.3)
rusage0, stat0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, stat_minflt(), time.perf_counter()
for _ in range(rounds):
    block = bytearray(mib << 20)
    del block
t1, stat1, rusage1 = time.perf_counter(), stat_minflt(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
with open(report, "a") as f:
    f.write(json.dumps({
        "rounds": rounds,
        "pages_per_round": (mib << 20) // 4096,
        "minflt": rusage1 - rusage0,
        "stat_minflt": stat1 - stat0,
        "ms": (t1 - t0) * 1e3,
    }) + "\n")
