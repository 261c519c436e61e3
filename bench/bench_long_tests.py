"""The test suite's long versions: tests sized with ``tests/long_runs.py`` at their long size.

Run: ``python -m bench.bench_long_tests [--only SUBSTRING] [--suite-sizes] [--list]``. The suite (``make
test``) runs these tests at a size that still proves their claim in seconds (two kill -9 rounds, a 250k
burst); here they run with ``SLUICE_TEST_LONG=1`` (four kill -9 rounds, a 1M burst, ...), one pytest
process per test, serially, and each one's outcome and time are printed. Exit 1 when one fails. Run it
after touching crash recovery, transactions or backpressure, and say how loaded the machine was
(``uptime``): the tests wait on real processes. ``--suite-sizes`` runs them at the suite's sizes (what
``--quick`` in ``bench.run_all`` does for one of them: the runner itself still works).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["LONG_TESTS", "main"]

ROOT = Path(__file__).resolve().parents[1]

# Each sized with tests.long_runs.sized (suite size -> long size in the comment).
LONG_TESTS = (
    # 250k -> 1M records burst into the log while the sink is blocked
    "tests/processors/test_runner.py::test_a_slow_sink_pauses_fetching_and_a_burst_stays_in_the_log",
    # kill -9 of a standalone processor: 3 -> 4 rounds
    "tests/processors/test_standalone.py::test_kill_9_at_random_points_then_restart_loses_no_window",
    # exactly-once, kill -9 of the processor: 2 -> 4 rounds
    "tests/processors/test_exactly_once.py::test_kill_9_at_random_points_read_committed_sees_every_window_exactly_once",
)


def run_one(test: str, *, long: bool) -> tuple[bool, float]:
    env = {**os.environ, "SLUICE_TEST_LONG": "1" if long else "0"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], cwd=ROOT, env=env)
    return done.returncode == 0, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_long_tests", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", metavar="SUBSTRING", help="only the tests whose id contains this")
    parser.add_argument("--suite-sizes", action="store_true", help="the sizes make test uses (a smoke run)")
    parser.add_argument("--list", action="store_true", help="list the tests and exit")
    args = parser.parse_args(argv)
    chosen = [t for t in LONG_TESTS if args.only in t]
    if args.list or not chosen:
        print("\n".join(LONG_TESTS))
        return 0 if chosen else 2
    results = [(test, *run_one(test, long=not args.suite_sizes)) for test in chosen]
    size = "suite sizes" if args.suite_sizes else "long sizes (SLUICE_TEST_LONG=1)"
    print(f"\n{len(results)} tests at {size}:")
    for test, ok, seconds in results:
        print(f"  {'ok    ' if ok else 'FAILED'} {seconds:7.1f} s  {test}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
