"""A table the kernel merges with a malloc block (issue 47 point 2): a 96 MiB table mapped
private and anonymous through libc's mmap, then a hot 4 MiB block from malloc (glibc maps
it with its internal mmap), which the kernel places right below the table and merges with
it into one mapping (unless the table is locked by then: its pages then have an anon_vma
the block's do not share). After start-up, the table is touched lazily, one byte per page,
in a timed phase (the block is rewritten too, without faults). Appends its own account of
that phase to REPORT as one JSON line, as lazy_table.py does.

    python3 merged_table.py REPORT
"""
import ctypes
import json
import mmap
import resource
import sys
import time

BLOCK = 4 << 20
TABLE = 96 << 20
PAGE = mmap.PAGESIZE

libc = ctypes.CDLL(None, use_errno=True)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]

report = sys.argv[1]
table = libc.mmap(None, TABLE, mmap.PROT_READ | mmap.PROT_WRITE,
                  mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
if table is None or table == ctypes.c_void_p(-1).value:
    raise OSError(ctypes.get_errno(), "mmap")
block = libc.malloc(BLOCK)
ctypes.memset(block, 1, BLOCK)
merged = None
with open("/proc/self/maps") as maps:
    for line in maps:
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= table < hi:
            merged = hi - lo
time.sleep(0.5)
minflt0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
for offset in range(0, TABLE, PAGE):
    ctypes.memset(table + offset, 1, 1)
ctypes.memset(block, 2, BLOCK)
t1, minflt1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
with open(report, "a") as f:
    f.write(json.dumps({
        "pages": TABLE // PAGE,
        "merged_bytes": merged,
        "timed_minflt": minflt1 - minflt0,
        "timed_ms": (t1 - t0) * 1e3,
    }) + "\n")
