"""bench.run_all: module discovery, --only, and a real run of one module cut short by --timeout."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.run_all import MODULES, QUICK_ARGS, discover, select


def test_every_bench_module_is_known_in_run_order() -> None:
    found = discover()
    assert found == list(MODULES)  # a new bench_*.py gets a place in MODULES (and quick arguments)
    assert set(QUICK_ARGS) == set(MODULES)


def test_only_accepts_short_names_and_commas_and_keeps_run_order() -> None:
    available = discover()
    assert select(available, ["tcp,bench_log", "kafka"]) == ["bench_log", "bench_tcp", "bench_kafka"]
    assert select(available, []) == available
    with pytest.raises(ValueError, match="unknown benchmark 'nope'"):
        select(available, ["nope"])


def run_all(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bench.run_all", *args], capture_output=True, text=True, timeout=60)


def test_unknown_name_exits_2_and_names_the_choices() -> None:
    done = run_all("--only", "nope")
    assert done.returncode == 2 and "choose from: bench_kafka_codec" in done.stderr


def test_a_module_is_run_its_output_kept_and_summarised(tmp_path: Path) -> None:
    # bench_kafka_codec takes several seconds; the watchdog kills it after 1 s, a failure the summary reports.
    done = run_all("--only", "kafka_codec", "--out", str(tmp_path), "--timeout", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    output = tmp_path / "bench_kafka_codec.txt"
    assert output.read_text().startswith("$ python -m bench.bench_kafka_codec")
    summary = (tmp_path / "SUMMARY.txt").read_text()
    assert re.search(r"bench_kafka_codec +timed out after 1 s", summary) and str(output) in summary  # column width
    assert f"1 ran, 0 ok, 1 failed (bench_kafka_codec), {len(MODULES) - 1} not selected." in summary
    assert summary in done.stdout


def test_every_long_test_exists_and_is_sized() -> None:
    from bench.bench_long_tests import LONG_TESTS, ROOT

    for test in LONG_TESTS:
        path, name = test.split("::")
        source = (ROOT / path).read_text()
        assert f"def {name}(" in source, test  # a renamed test would silently drop out of the long runs
        assert "sized(" in source, test
