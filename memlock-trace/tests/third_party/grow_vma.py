"""One mapping region met by the fault hooks under several VMA starts, for tests/mappings.rs
(issue 47 point 1). Prints its own account (JSON).

grown: one anonymous VMA grown downwards in 1 MiB steps (a new step mapped just below it,
which the kernel merges into it, then touched), as memcached's slab VMA grows: its faults
are keyed by each start it had. locked: a region touched in part, then its top half
mlocked (the mlock splits the VMA and populates the rest): a start before the mlock, one
after. Each is mapped inside a PROT_NONE reservation, so that no neighbour merges into it,
at addresses no earlier mapping had."""
import ctypes
import json
import mmap
import os

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4

PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
PRIVATE_ANON = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
MAP_FIXED = 0x10
MAP_NORESERVE = 0x4000
PR_SET_THP_DISABLE = 41
# Far below the binaries, the heap and the mmap area, within even a 39-bit address space.
GROWN_AT = 0x40_0000_0000
LOCKED_AT = 0x48_0000_0000
STEP_PAGES = 256
STEPS = 10
LOCKED_PAGES = 32
LOCKED_TOUCHED = 24


def mapped(at, length, prot, flags):
    addr = libc.mmap(at, length, prot, flags, -1, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        raise OSError(ctypes.get_errno(), "mmap")
    return addr


def reserve(at, pages):
    """PROT_NONE pages at `at`, addresses this process has never used: a mapping unmapped
    before (python's own, at start-up) would have rows of its own over the region's."""
    addr = mapped(at, pages * PAGE, 0, PRIVATE_ANON | MAP_NORESERVE)
    if addr != at:
        raise OSError(f"reservation placed at {addr:#x}, not at the free {at:#x} asked for")
    return addr


def touch(start, pages):
    for i in range(pages):
        ctypes.memset(start + i * PAGE, 1, 1)


def vmas(start, end):
    """The VMAs of /proc/self/maps overlapping [start, end)."""
    out = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo < end and start < hi:
                out.append([lo, hi])
    return out


# One fault per page: no transparent huge page maps 512 of them at once.
if libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl")

step = STEP_PAGES * PAGE
top = reserve(GROWN_AT, (STEPS + 2) * STEP_PAGES) + (STEPS + 1) * step
for i in range(1, STEPS + 1):
    at = top - i * step
    mapped(at, step, PROT_RW, PRIVATE_ANON | MAP_FIXED)
    touch(at, STEP_PAGES)
grown = [top - STEPS * step, top]

locked = reserve(LOCKED_AT, LOCKED_PAGES + 2) + PAGE
mapped(locked, LOCKED_PAGES * PAGE, PROT_RW, PRIVATE_ANON | MAP_FIXED)
touch(locked, LOCKED_TOUCHED)
half = LOCKED_PAGES // 2 * PAGE
if libc.mlock(locked + half, half) != 0:
    raise OSError(ctypes.get_errno(), "mlock")
locked = [locked, locked + LOCKED_PAGES * PAGE]

print(json.dumps({
    "pid": os.getpid(),
    "grown": grown,
    "grown_faults": STEPS * STEP_PAGES,
    "grown_vmas": vmas(*grown),
    "locked": locked,
    "locked_faults": LOCKED_PAGES,
    "locked_vmas": vmas(*locked),
}))
