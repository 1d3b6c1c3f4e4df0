"""Keep a long-lived worker's freed heap memory mapped (glibc malloc's tunables).

Why: glibc hands freed memory back to the kernel (its trim and mmap thresholds) and the next
pass that needs it takes a page fault per 4 KiB page as it touches it again. In a Ray device
worker those faults cost ~15-20 µs each (system time), and a step's update took 3,000-4,000 of
them whenever its activations outgrew what the heap still held: +40-80 ms on a 60-100 ms update
of the bench's pipelines, mostly in their first steps (`bench real`, instrumented worker,
docs/BENCHMARKS.md "First steps"). The cost model's profile times passes repeated at one shape,
with the heap already grown, so the simulator never saw those faults. Raising both thresholds
keeps what a worker has grown once; with a warm-up at each pipeline's largest batch before the
run clock (:mod:`jigsawrl.engine.warmup`) no step faults.

The price is memory: a worker's resident size stays at its peak instead of shrinking between
passes (a few hundred MB for the demo's models). Only glibc has these tunables: elsewhere (musl,
macOS) :func:`keep_freed_memory` does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

log = logging.getLogger(__name__)

# mallopt parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc ignores an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit): the largest it takes.
MAX_MMAP_THRESHOLD = 32 << 20


def keep_freed_memory(trim_threshold: int = 1 << 30,
                      mmap_threshold: int = MAX_MMAP_THRESHOLD) -> bool:
    """Set glibc's trim threshold (free memory at the heap's top kept up to this size) and its
    mmap threshold (allocations at least this big get their own mapping, unmapped on free);
    True when both took effect. Setting either also stops glibc from moving the thresholds by
    itself. Call once per process, early."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        log.info("allocator tunables skipped: not glibc (%s)", platform.libc_ver()[0] or "unknown")
        return False
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
    except OSError as exc:
        log.warning("allocator tunables skipped: %s", exc)
        return False
    ok = bool(libc.mallopt(M_TRIM_THRESHOLD, int(trim_threshold)))
    ok = bool(libc.mallopt(M_MMAP_THRESHOLD, int(mmap_threshold))) and ok
    if not ok:
        log.warning("glibc refused the allocator tunables (trim %d, mmap %d)",
                    trim_threshold, mmap_threshold)
    return ok
