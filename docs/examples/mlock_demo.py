"""Locks a 4 MiB buffer three times, then makes one mlock call that fails (ENOMEM).

Run it under the tracer: sudo memlock-trace -- python3 docs/examples/mlock_demo.py
"""

import ctypes
import mmap

libc = ctypes.CDLL(None, use_errno=True)
size = 4 << 20
buf = mmap.mmap(-1, size)  # anonymous, not touched yet
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
for _ in range(3):
    libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(size))  # the first populates 1024 pages
    libc.munlock(ctypes.c_void_p(addr), ctypes.c_size_t(size))
libc.mlock(ctypes.c_void_p(0), ctypes.c_size_t(1 << 60))  # more than RLIMIT_MEMLOCK: ENOMEM
print("done")
