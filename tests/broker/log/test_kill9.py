"""SIGKILL a process appending with flush=always: after restart every acknowledged batch is there."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from broker.log.segment import SegmentLogStore
from tests.broker.log.helpers import all_records, open_store

REPO = Path(__file__).resolve().parents[3]


def run_child_until_killed(root: Path, run: int, kill_after_acks: int) -> list[tuple[int, int, str]]:
    """Start the child, SIGKILL it after ``kill_after_acks`` acknowledgements, return every ack it sent."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.broker.log.append_child", str(root), str(run)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + 60
    try:
        while buf.count(b"\n") < kill_after_acks + 1:  # +1 for "ready"
            assert time.monotonic() < deadline, "child made no progress"
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                chunk = os.read(fd, 65536)
                assert chunk, f"child exited early: {proc.stderr.read().decode() if proc.stderr else ''}"
                buf += chunk
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        while chunk := os.read(fd, 65536):  # acks written before the kill are still in the pipe
            buf += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        if proc.stderr is not None:
            proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    lines = buf.decode().splitlines()
    assert lines[0] == "ready"
    acks = []
    for line in lines[1:]:
        p, offset, value = line.split(" ", 2)
        acks.append((int(p), int(offset), value))
    return acks


async def test_every_acknowledged_append_survives_sigkill(tmp_path: Path) -> None:
    rng = random.Random(2024)
    acknowledged: dict[tuple[int, int], str] = {}
    for run in range(6):
        acks = run_child_until_killed(tmp_path, run, kill_after_acks=rng.randint(1, 600))
        assert acks
        for p, offset, value in acks:
            assert (p, offset) not in acknowledged, "an offset was handed out twice"
            acknowledged[(p, offset)] = value
        store: SegmentLogStore = await open_store(tmp_path)
        try:
            for p in range(2):
                log = store.partition("k", p)
                records = all_records(log)
                assert [r.offset for r in records] == list(range(log.high_watermark))  # dense, nothing torn
                stored = {r.offset: (r.value or b"").decode() for r in records}
                for (ap, offset), value in acknowledged.items():
                    if ap == p:
                        assert stored.get(offset) == value, f"acknowledged {p}/{offset} lost after kill -9 #{run}"
        finally:
            await store.close()
