"""``sluice serve``'s garbage-collector settings (sluice/gc_tuning.py), applied in a fresh interpreter so the
test process keeps CPython's defaults."""

from __future__ import annotations

import subprocess
import sys


def test_tune_for_serving_freezes_the_start_up_heap_and_raises_gen0() -> None:
    code = (
        "import gc; from sluice.gc_tuning import GEN0_THRESHOLD, tune_for_serving\n"
        "before = gc.get_threshold(); tune_for_serving()\n"
        "assert gc.get_threshold() == (GEN0_THRESHOLD, before[1], before[2]), gc.get_threshold()\n"
        "assert gc.get_freeze_count() > 1000, gc.get_freeze_count()\n"
        "x = []; x.append(x); del x\n"
        "assert gc.collect() >= 1  # cyclic garbage is still collected\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
