"""Short-lived mappings, for tests/mappings.rs: regions mapped, touched and unmapped in
far less than the tracer's 40 ms between two reads of /proc/PID/smaps, a region populated
by mmap(MAP_POPULATE), and an mlock on a range nothing maps. Prints its own account (JSON)."""
import ctypes
import json
import mmap
import os
import resource

PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
libc.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def address(m):
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


# Private anonymous, touched page by page, unmapped at once.
touched = []
for _ in range(4):
    m = mmap.mmap(-1, 2 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # One fault per page: a 2 MiB region may otherwise get a transparent huge page (one
    # fault for all of it, as the 6.12 guest does).
    m.madvise(mmap.MADV_NOHUGEPAGE)
    for off in range(0, len(m), PAGE):
        m[off] = 1
    touched.append(address(m))
    m.close()

# Populated by the kernel inside mmap: no fault exception for these pages.
populated = mmap.mmap(-1, 1 << 20,
                      flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
populated_at = address(populated)

unmapped = 0x10000
ret = libc.mlock(unmapped, PAGE)
errno = ctypes.get_errno()
print(json.dumps({
    "pid": os.getpid(),
    "touched": touched,
    "touched_pages": (2 << 20) // PAGE,
    "populated": populated_at,
    "populated_pages": (1 << 20) // PAGE,
    "mlock_ret": ret,
    "mlock_errno": errno,
    "minflt": resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
}))
