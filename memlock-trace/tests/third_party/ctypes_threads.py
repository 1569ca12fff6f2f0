import ctypes, json, mmap, os, threading

libc = ctypes.CDLL(None, use_errno=True)
for name in ("mlock", "munlock"):
    getattr(libc, name).argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.syscall.restype = ctypes.c_long
PAGE = mmap.PAGESIZE
MCL_CURRENT = 1
SYS_MLOCK2 = 325  # x86_64
PAGES = 4
# Per worker thread: (mlock, mlock2) calls; each is undone by one munlock.
PLAN = [(3, 0), (5, 0), (2, 4)]


def vmlck_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmLck:"):
                return int(line.split()[1])


def check(ret):
    if ret != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


# mlockall first, while nothing else is locked and no other thread changes the mappings.
vmlck = [vmlck_kib()]
check(libc.mlockall(MCL_CURRENT))
vmlck.append(vmlck_kib())
check(libc.munlockall())
vmlck.append(vmlck_kib())

barrier = threading.Barrier(len(PLAN))
results = [None] * len(PLAN)


def worker(i):
    buf = mmap.mmap(-1, PAGES * PAGE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    mlocks, mlock2s = PLAN[i]
    barrier.wait()  # all alive at once: distinct thread ids
    counts = {"mlock": 0, "munlock": 0, "mlock2": 0}
    for _ in range(mlocks):
        check(libc.mlock(addr, PAGES * PAGE))
        counts["mlock"] += 1
        check(libc.munlock(addr, PAGES * PAGE))
        counts["munlock"] += 1
    for _ in range(mlock2s):
        check(libc.syscall(SYS_MLOCK2, ctypes.c_void_p(addr), ctypes.c_size_t(PAGES * PAGE), 0))
        counts["mlock2"] += 1
        check(libc.munlock(addr, PAGES * PAGE))
        counts["munlock"] += 1
    results[i] = {"tid": threading.get_native_id(), **counts}


threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(PLAN))]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({
    "pid": os.getpid(),
    "main_tid": threading.get_native_id(),
    "vmlck_kib": vmlck,
    "page_size": PAGE,
    "threads": results,
}))
