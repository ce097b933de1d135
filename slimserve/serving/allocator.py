"""The C allocator's setting for long-running services (glibc only).

glibc serves a large block (a request field of hundreds of KiB) from ``mmap`` and returns it on free, but
after the first such free it raises its mmap threshold (up to 32 MiB), so later large blocks land in the
heap, where they leave holes the heap cannot give back. Under varied request sizes the services' resident
memory then grows with the number of calls: in ``bench faults``' fuzz case (texts up to 1 MB) 108 -> 133
MiB after 6,000 calls, 108 -> 126 MiB with the threshold fixed by this module's call at start, 108 -> 122
MiB with ``MALLOC_MMAP_THRESHOLD_`` set from the first allocation (docs/faults.md). Fixed, it keeps
blocks above 128 KiB in ``mmap``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc <malloc.h>
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's initial value, kept fixed
# What the service image sets (services/Containerfile) and `bench` gives the services it starts: the
# threshold from the first allocation, and CPython's objects from malloc rather than its own 1 MiB arenas
# (one live object keeps a whole arena; docs/faults.md measures both).
SERVICE_ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES), "PYTHONMALLOC": "malloc"}


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold (no dynamic raise); False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    log.debug("mmap threshold fixed at %d bytes: %s", MMAP_THRESHOLD_BYTES, done)
    return done
