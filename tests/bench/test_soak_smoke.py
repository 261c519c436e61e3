"""bench.bench_soak end to end, cut small: a broker, a device fleet over MQTT and Kafka, samples, read-back."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_soak_samples_memory_and_reads_the_log_back() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_soak", "--duration", "8", "--devices", "6", "--sample-s", "1"],
        capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| (\d+) \| ([\d.]+) \|$", done.stdout, re.MULTILINE)
    assert len(rows) >= 5 and all(float(rss) > 0 for _, rss, _, _ in rows)
    read_back = re.search(r"read back: (\d+) records .* ratio ([\d.]+)", done.stdout)
    assert read_back is not None and int(read_back.group(1)) > 0, done.stdout
    assert "plateau: median RSS" in done.stdout
