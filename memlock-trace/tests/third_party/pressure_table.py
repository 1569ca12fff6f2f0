"""A program whose hot table is pushed out to swap by its own streaming: it maps a HOT-byte
table and a STREAM-byte buffer (shared anonymous memory, through the mmap module), fills
the table, then ROUNDS times: marks the table cold (madvise(MADV_COLD) through ctypes, as a
table left alone while the program works elsewhere would age), writes one byte per page of
the buffer, and reads the table back, one byte per page, timed. In a memory cgroup below
HOT + STREAM with swap, the buffer's pages push the table's out, and each read of the table
takes them back from swap as major faults: what locking the table removes. A locked table
refuses MADV_COLD (EINVAL): it stays resident, and that is the point.
It appends its own account as one JSON line to REPORT: the major faults and the time of each
read of the table (getrusage), then holds its memory HOLD seconds, so that a sampler's last
look sees it.

    python3 pressure_table.py REPORT HOT STREAM ROUNDS [HOLD]
"""

import ctypes
import json
import mmap
import resource
import sys
import time

MADV_COLD = 20

report, hot_size, stream_size, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
hold = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
page = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

hot = mmap.mmap(-1, hot_size)
stream = mmap.mmap(-1, stream_size)
hot_addr = ctypes.addressof(ctypes.c_char.from_buffer(hot))
for offset in range(0, hot_size, page):
    hot[offset] = 1
cold_refused = 0
reads = []
for r in range(rounds):
    if libc.madvise(hot_addr, hot_size, MADV_COLD) != 0:
        cold_refused += 1
    for offset in range(0, stream_size, page):
        stream[offset] = (r + 2) & 0xFF
    ru0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    total = 0
    for offset in range(0, hot_size, page):
        total += hot[offset]
    t1, ru1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    reads.append({
        "ms": (t1 - t0) * 1e3,
        "majflt": ru1.ru_majflt - ru0.ru_majflt,
        "minflt": ru1.ru_minflt - ru0.ru_minflt,
    })
with open(report, "a") as f:
    f.write(json.dumps({
        "hot_pages": hot_size // page,
        "reads": reads,
        "hot_majflt": sum(r["majflt"] for r in reads),
        "hot_ms": sum(r["ms"] for r in reads),
        "cold_refused": cold_refused,
    }) + "\n")
time.sleep(hold)
