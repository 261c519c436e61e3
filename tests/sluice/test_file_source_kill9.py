"""A file source resumes exactly after ``kill -9`` of ``sluice serve``: every line of the file is in the log
once (ingest/file/positions.py), read back with kcat.

``sluice serve`` replays an NDJSON file in small chunks (many chunks, so the kills land mid-chunk too) into
a topic of 4 partitions; it is killed with SIGKILL at seeded random moments while the replay runs, and
restarted on the same data directory each time, until the replay has reached the end of the file.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

LINES = 30_000
KILLS = 4


def _start(data_dir: Path, config: Path, log: Path) -> subprocess.Popen[bytes]:
    endpoints = data_dir / "endpoints.json"
    if endpoints.exists():
        endpoints.unlink()
    env = {**os.environ, "SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__ENABLED": "false", "SLUICE_TCP__ENABLED": "false",
           "SLUICE_HTTP__ENABLED": "false", "SLUICE_STORAGE__DEFAULT_PARTITIONS": "4", "SLUICE_STORAGE__FLUSH": "os",
           "SLUICE_EVENT_LOOP": "uvloop"}
    with log.open("ab") as stderr:
        return subprocess.Popen([sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(data_dir),
                                 "--config", str(config)], env=env, stderr=stderr, stdout=subprocess.DEVNULL)


def _kafka_port(data_dir: Path, proc: subprocess.Popen[bytes], log: Path) -> int:
    deadline = time.monotonic() + 120  # a deadline, not a wait: returns as soon as the file is there
    endpoints = data_dir / "endpoints.json"
    while True:
        if endpoints.exists():
            data = json.loads(endpoints.read_text())
            if "kafka" in data:
                return int(data["kafka"]["port"])
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "sluice did not start"
        time.sleep(0.05)


def _position(data_dir: Path) -> dict[str, object] | None:
    try:
        loaded: dict[str, object] = json.loads((data_dir / "ingest" / "files" / "readings.json").read_text())
    except (FileNotFoundError, ValueError):
        return None
    return loaded


def test_kill_9_during_a_replay_stores_every_line_once(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("SLUICE_TEST_SEED", "7")))
    source = tmp_path / "readings.ndjson"
    lines = [json.dumps({"device_id": f"d{i % 10}", "i": i}) for i in range(LINES)]
    source.write_text("\n".join(lines) + "\n")
    size = source.stat().st_size
    config = tmp_path / "sluice.toml"
    config.write_text(f'[[ingest.files]]\nname = "readings"\npath = "{source}"\nformat = "ndjson"\n'
                      f'mode = "replay"\ntopic = "readings"\nkey = "field:device_id"\nread_bytes = 2048\n')
    data_dir = tmp_path / "data"
    log = tmp_path / "sluice.log"
    proc = _start(data_dir, config, log)
    kills = 0
    try:
        port = _kafka_port(data_dir, proc, log)
        while True:
            position = _position(data_dir)
            if position is not None and position["offset"] == size and "pending" not in position:
                break
            if kills < KILLS and position is not None:  # the replay is under way: kill it at a random moment
                time.sleep(rng.uniform(0.0, 0.3))
                proc.kill()
                proc.wait()
                kills += 1
                proc = _start(data_dir, config, log)
                port = _kafka_port(data_dir, proc, log)
                continue
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.05)
        read = subprocess.run(["kcat", "-C", "-b", f"127.0.0.1:{port}", "-t", "readings", "-o", "beginning", "-e",
                               "-q", "-f", "%s\n"], capture_output=True, timeout=120, check=True)
    finally:
        proc.kill()
        proc.wait()
    assert kills == KILLS
    counts = Counter(read.stdout.decode().splitlines())
    twice = [line for line, n in counts.items() if n > 1]
    assert not twice, f"{len(twice)} lines stored more than once, e.g. {twice[:3]}"
    assert set(counts) == set(lines), f"{len(set(lines) - set(counts))} lines missing"
