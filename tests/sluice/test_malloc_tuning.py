"""``sluice.malloc_tuning``: large buffers freed by a serving process go back to the system.

Each case runs in a fresh interpreter (glibc's thresholds are per process): it frees one large block
(which, untuned, raises glibc's dynamic mmap threshold), then holds thirty 1 MiB buffers at once, as
concurrent Produce requests do, each followed by a small block that lives on (a record of the request's
bookkeeping), frees the large ones, and reports how much of that RSS stayed.
"""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from sluice.malloc_tuning import return_large_buffers

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

PROBE = """
import sys
from sluice.malloc_tuning import return_large_buffers

def rss_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

if sys.argv[1] == "tuned":
    assert return_large_buffers()
first = bytearray(1 << 20)
del first
before = rss_kib()
held, kept = [], []
for _ in range(30):
    held.append(bytearray(1 << 20))
    held[-1][::4096] = b"x" * 256  # touch every page
    kept.append(bytes(600))  # a small block that outlives the request (above pymalloc's 512 bytes)
del held
print(rss_kib() - before)
"""


def retained_kib(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], check=True, capture_output=True, text=True)
    return int(out.stdout)


def test_freed_large_buffers_leave_the_process() -> None:
    assert retained_kib("tuned") < 4 * 1024


def test_untuned_glibc_keeps_them_which_is_why_the_tuning_exists() -> None:
    assert retained_kib("default") > 20 * 1024


def test_it_reports_success_on_glibc() -> None:
    assert return_large_buffers() is True
