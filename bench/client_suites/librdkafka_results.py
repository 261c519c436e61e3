#!/usr/bin/env python3
"""Compare librdkafka test-runner outcomes with the expectations kept beside this script.

Usage: compare_results.py LOGS_DIR EXPECTED. ``LOGS_DIR/PHASE/NNNN.log`` is one test-runner run's output.
A test's outcome is read from the lines the runner prints: ``== Test NAME PASSED ==`` / ``SKIPPED``,
``### Test "NAME ..." failed at``; a test that started and printed neither was killed (TIMEOUT) or took
the runner down (CRASHED). EXPECTED holds ``PHASE TEST STATUS reason`` lines (``#`` comments; STATUS
FAILED, SKIPPED or FLAKY = either way); a test not listed there is expected to pass.
Prints every test that did not simply pass as expected, then ``N passed, N failed, N skipped``.
Exit 1 when a test expected to pass did not, or a known failure now passes (update EXPECTED), else 0.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STARTED = re.compile(r"={5,} Running test (\S+) ={5,}")
_ENDED = re.compile(r"={5,} Test (\S+) (PASSED|SKIPPED) ={5,}")
_FAILED = re.compile(r'^### Test "([^" ]+)')


def outcomes(log: Path) -> dict[str, str]:
    """test name -> PASSED, FAILED, SKIPPED, TIMEOUT or CRASHED for one runner log."""
    text = _ANSI.sub("", log.read_text(errors="replace"))
    found: dict[str, str] = {}
    started: list[str] = []
    for line in text.splitlines():
        if m := _STARTED.search(line):
            started.append(m.group(1))
        elif m := _ENDED.search(line):
            found.setdefault(m.group(1), m.group(2))
        elif (m := _FAILED.match(line)) and m.group(1) != "<MAIN>":
            found[m.group(1)] = "FAILED"  # a failure wins over a PASSED line printed after it
    killed = "TIMEOUT" if "Terminated" in text or not text.rstrip().endswith(("PASSED", "failed.")) else "CRASHED"
    for name in started:
        found.setdefault(name, killed)
    return found


def read_expected(path: Path) -> dict[tuple[str, str], tuple[str, str]]:
    table: dict[tuple[str, str], tuple[str, str]] = {}
    for line in path.read_text().splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3 and not line.lstrip().startswith("#"):
            table[(parts[0], parts[1])] = (parts[2], parts[3] if len(parts) > 3 else "")
    return table


def main(logs_dir: str, expected_path: str) -> int:
    expected = read_expected(Path(expected_path))
    counts = {"PASSED": 0, "FAILED": 0, "SKIPPED": 0}
    surprises = 0
    for phase_dir in sorted(p for p in Path(logs_dir).iterdir() if p.is_dir()):
        for log in sorted(phase_dir.glob("*.log")):
            for test, status in sorted(outcomes(log).items()):
                counts[status if status in counts else "FAILED"] += 1
                want, reason = expected.get((phase_dir.name, test), ("PASSED", ""))
                if status == want == "PASSED":
                    continue
                if status == want or (want == "FLAKY" and status in ("PASSED", "FAILED", "TIMEOUT")):
                    note = f"known: {reason}"
                elif want == "PASSED":
                    note, surprises = "REGRESSION: expected to pass", surprises + 1
                elif status == "PASSED":
                    note, surprises = f"NOW PASSES (listed {want}: {reason}): update the list", surprises + 1
                else:
                    note = f"listed {want}: {reason}"
                print(f"{phase_dir.name:13} {test:44} {status:8} {note}")
    print(f"{counts['PASSED']} passed, {counts['FAILED']} failed, {counts['SKIPPED']} skipped")
    return 1 if surprises else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
