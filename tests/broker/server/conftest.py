"""A real Sluice process on port 0 for the wire tests with third-party Kafka clients."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.log.partitioner import partition_for_key


@dataclass
class SluiceProcess:
    data_dir: Path
    partitions: int = 1
    proc: subprocess.Popen[str] | None = None
    port: int = 0
    env: dict[str, str] = field(default_factory=dict)  # more SLUICE_* settings, applied last
    stderr_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.stderr_path = self.data_dir.parent / f"{self.data_dir.name}.stderr.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        endpoints = self.data_dir / "endpoints.json"
        if endpoints.exists():
            endpoints.unlink()
        env = {
            **os.environ,
            "SLUICE_KAFKA__PORT": "0",
            "SLUICE_MQTT__ENABLED": "false",
            "SLUICE_TCP__ENABLED": "false",
            "SLUICE_HTTP__ENABLED": "false",
            "SLUICE_STORAGE__DEFAULT_PARTITIONS": str(self.partitions),
            "SLUICE_STORAGE__FLUSH": "os",
            "SLUICE_EVENT_LOOP": "uvloop",
            # Groups form at once unless a test is about Kafka's initial rebalance delay.
            "SLUICE_KAFKA__GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
            **self.env,
        }
        stderr = self.stderr_path.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(self.data_dir)],
            env=env, stderr=stderr, stdout=subprocess.DEVNULL, text=True,
        )
        deadline = time.monotonic() + 120  # a deadline, not a wait (see tests/sluice_server.py)
        while True:
            if endpoints.exists():
                data = json.loads(endpoints.read_text())
                if "kafka" in data:
                    self.port = int(data["kafka"]["port"])
                    return
            assert self.proc.poll() is None, self.stderr_path.read_text()
            assert time.monotonic() < deadline, "sluice did not start"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log_text(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""


@pytest.fixture
def sluice_factory(tmp_path: Path) -> Iterator[type[SluiceProcess]]:
    started: list[SluiceProcess] = []

    class _Factory(SluiceProcess):
        def __post_init__(self) -> None:
            super().__post_init__()
            started.append(self)

    yield _Factory
    for proc in started:
        proc.stop()


def check_records(
    received: Sequence[tuple[int, int, bytes | None, bytes | None]], expected_values: set[bytes], partitions: int
) -> None:
    """Every value arrived, offsets increase per partition, each key sits in its murmur2 partition."""
    values = [v for _, _, _, v in received]
    assert set(values) == expected_values, f"missing {len(expected_values - set(values))} records"
    last: dict[int, int] = {}
    for partition, offset, key, _value in received:
        assert offset > last.get(partition, -1), f"partition {partition}: offset {offset} out of order"
        last[partition] = offset
        if key is not None:
            assert partition == partition_for_key(key, partitions), f"key {key!r} in partition {partition}"


def values_in_key_order(received: Sequence[tuple[int, int, bytes | None, bytes | None]]) -> None:
    """Records of one key come back in produce order (values carry a per-key sequence number)."""
    seen: dict[bytes, int] = {}
    for _p, _o, key, value in received:
        assert key is not None and value is not None
        seq = int(value.split(b":")[1])
        assert seq > seen.get(key, -1), f"key {key!r}: {seq} after {seen.get(key)}"
        seen[key] = seq
