"""Major faults of every kind, for a tracer to tell apart. It moves itself into the memory
cgroup whose process list is PROCS, then, with MIB-MiB regions:

- reads a file it wrote to DIR (a disk's file system: a tmpfs file is shmem) and dropped
  from the page cache, through a shared mapping, then (dropped again) through a private
  one, without readahead: file pages read in, each by a fault of its own;
- writes every page of that private mapping (copies: anonymous pages in a file mapping), of
  a shared anonymous mapping (shmem) and of a private anonymous one;
- writes 8 times MIB MiB more, which pushes the three out to swap in a cgroup below that;
- reads each of the three back, one byte per page.

It prints one JSON line: each read's major faults (getrusage), and how many pages of each
region smaps said were in swap before its read.

    python3 major_kinds.py PROCS DIR MIB
"""

import ctypes
import json
import mmap
import os
import resource
import sys

procs, workdir, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(procs, "w") as f:
    f.write(str(os.getpid()))
page = mmap.PAGESIZE
size = mib << 20


def majflt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


def touch(region, write):
    for i in range(0, size, page):
        if write:
            region[i] = 1
        else:
            region[i]


def majors_of_read(region):
    before = majflt()
    touch(region, False)
    return majflt() - before


def swapped_pages(region):
    """The Swap: of the region's VMA in smaps, in pages."""
    start = ctypes.addressof(ctypes.c_char.from_buffer(region))
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                inside = int(head.split("-")[0], 16) == start
            elif inside and head == "Swap:":
                return int(line.split()[1]) * 1024 // page
    raise RuntimeError("no smaps entry at %#x" % start)


path = os.path.join(workdir, "major_kinds.%d.bin" % os.getpid())
with open(path, "wb") as f:
    f.write(os.urandom(size))
    f.flush()
    os.fsync(f.fileno())
fd = os.open(path, os.O_RDONLY)
os.unlink(path)
out = {}
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
shared_file = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
# No readahead: each page read by a fault of its own.
shared_file.madvise(mmap.MADV_RANDOM)
out["file_shared"] = majors_of_read(shared_file)
shared_file.close()
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
private_file = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
private_file.madvise(mmap.MADV_RANDOM)
out["file_private"] = majors_of_read(private_file)
shmem = mmap.mmap(-1, size, mmap.MAP_SHARED)
anon = mmap.mmap(-1, size, mmap.MAP_PRIVATE)
# Flags of its own, so that it never merges with the next anonymous mapping (smaps would
# count the two as one).
anon.madvise(mmap.MADV_NOHUGEPAGE)
regions = {"copied": private_file, "shmem": shmem, "anon": anon}
for region in regions.values():
    touch(region, True)
push = mmap.mmap(-1, 8 * size, mmap.MAP_PRIVATE)
for i in range(0, 8 * size, page):
    push[i] = 1
for name, region in regions.items():
    out[name + "_swapped"] = swapped_pages(region)
    out[name] = majors_of_read(region)
out["pid"] = os.getpid()
print(json.dumps(out), flush=True)
