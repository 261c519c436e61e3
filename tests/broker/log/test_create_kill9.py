"""SIGKILL a process while it creates wide topics: after restart every topic is whole (all partitions,
readable) and no directory belongs to a topic that does not exist. Before, a create opened every
partition's files first and saved topics.json last, so a kill left hundreds of orphan directories."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.broker.log.create_child import PARTITIONS
from tests.broker.log.helpers import all_records, open_store

REPO = Path(__file__).resolve().parents[3]


def run_child_until_killed(root: Path, run: int, kill_after: int, delay: float) -> list[str]:
    """Start the child, SIGKILL it ``delay`` seconds after its ``kill_after``-th topic; the topics it reported."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.broker.log.create_child", str(root), str(run)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + 60
    try:
        while buf.count(b"\n") < kill_after + 1:  # +1 for "ready"
            assert time.monotonic() < deadline, "child made no progress"
            if select.select([fd], [], [], 1.0)[0]:
                chunk = os.read(fd, 65536)
                assert chunk, "child exited early"
                buf += chunk
        time.sleep(delay)  # a kill at a random point of the next create (old code: seconds of file opening)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        while chunk := os.read(fd, 65536):
            buf += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    lines = buf.decode().splitlines()
    assert lines[0] == "ready"
    return lines[1:]


async def test_a_killed_create_leaves_whole_topics_and_no_orphans(tmp_path: Path) -> None:
    rng = random.Random(11)
    created: list[str] = []
    for run in range(2):
        created += run_child_until_killed(tmp_path, run, kill_after=rng.randint(1, 3), delay=rng.uniform(0.05, 0.5))
        store = await open_store(tmp_path)
        try:
            topics = {t.name: t.partitions for t in store.list_topics()}
            assert set(created) <= set(topics)  # every create that returned survived
            assert set(topics.values()) == {PARTITIONS}
            known = {f"{name}-{p}" for name in topics for p in range(PARTITIONS)}
            dirs = {entry.name for entry in tmp_path.iterdir() if entry.is_dir()}
            assert dirs <= known, f"orphan directories: {sorted(dirs - known)[:5]}"
            for name in topics:
                for log in store.partitions(name):
                    values = [r.value for r in all_records(log)]
                    assert values in ([], [name.encode()])
        finally:
            await store.close()
