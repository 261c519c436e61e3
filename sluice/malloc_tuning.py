"""glibc malloc settings for a long-running ``sluice serve`` process.

Large buffers (a Kafka Produce request of up to a few MiB, a Fetch answer) come and go with every
request. glibc serves blocks above ``M_MMAP_THRESHOLD`` (128 KiB at start) with their own mmap and gives
them back on free, but it raises that threshold each time such a block is freed ("dynamic mmap
threshold", up to 32 MiB), so after the first large request every later one is carved from the heap
instead, and the heap keeps its high-water mark: writing 0.2 or 1 GiB through four producers left RSS
~30 MiB (1.3×) above the fresh start, for good (bench/RESULTS.md, "Memory after 10 GiB").

``return_large_buffers`` sets both thresholds explicitly, which turns the dynamic adjustment off: large
blocks keep their own mappings and go back to the system when freed, and free heap above
``TRIM_THRESHOLD`` is returned. A no-op (False) where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "return_large_buffers"]

log = logging.getLogger(__name__)

MMAP_THRESHOLD = 128 * 1024  # glibc's own starting value
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # as glibc keeps it while the threshold is dynamic
_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3


def return_large_buffers() -> bool:
    """Fix glibc's mmap and trim thresholds; True when they were set."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    gnu_get_libc_version = getattr(libc, "gnu_get_libc_version", None)
    if mallopt is None or gnu_get_libc_version is None:  # musl's mallopt is a stub
        return False
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not done:
        log.warning("mallopt refused the mmap/trim thresholds; memory freed by large requests stays with the process")
    return done
