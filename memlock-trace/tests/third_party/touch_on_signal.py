"""A running process for `advise -p`: it touches BEFORE pages of a mapping of its own at
start-up, prints its pid and the faults it has counted (/proc/self/stat minflt + majflt),
and waits; on each SIGUSR1 it maps AFTER pages more and touches them, prints its count
again, and waits again, until it is killed.

    python3 touch_on_signal.py BEFORE AFTER
"""

import json
import mmap
import os
import signal
import sys


def faults():
    with open("/proc/self/stat") as f:
        text = f.read()
    # minflt and majflt (fields 10 and 12), counted after the comm's closing parenthesis.
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[7]) + int(fields[9])


def touch(m):
    for offset in range(0, len(m), mmap.PAGESIZE):
        m[offset] = 1


before, after = int(sys.argv[1]), int(sys.argv[2])
flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
startup = mmap.mmap(-1, before * mmap.PAGESIZE, flags=flags)
touch(startup)
kept = []
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
print(json.dumps({"pid": os.getpid(), "faults": faults()}), flush=True)
while True:
    signal.sigwait({signal.SIGUSR1})
    kept.append(mmap.mmap(-1, after * mmap.PAGESIZE, flags=flags))
    touch(kept[-1])
    print(json.dumps({"faults": faults()}), flush=True)
