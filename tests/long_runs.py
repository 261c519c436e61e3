"""Suite sizes and their long versions: one test, two scales.

A test whose claim grows more convincing with size (more kill -9 rounds, bigger bursts, longer live
streams) runs a small, still-meaningful size in ``make test`` and its long size when ``SLUICE_TEST_LONG=1``
is set; ``python -m bench.bench_long_tests`` runs the long versions (the suite must stay well under 20
minutes on a 2-core machine, so rounds that only add confidence live there).
"""

from __future__ import annotations

import os

__all__ = ["LONG", "sized"]

LONG = os.environ.get("SLUICE_TEST_LONG", "") == "1"


def sized(suite: int, long: int) -> int:
    """``suite`` in the test suite, ``long`` when SLUICE_TEST_LONG=1 (bench.bench_long_tests)."""
    return long if LONG else suite
