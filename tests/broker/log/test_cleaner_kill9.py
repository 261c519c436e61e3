"""kill -9 of a real process in the middle of cleaning: each segment is left either as it was or as
the cleaner finished it, never a mix, and a consumer still finds the latest value of every key."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.log.cleaner import LogCleaner
from broker.log.segment import SegmentLogStore
from broker.protocol.records import RecordSpec, encode_batch
from tests.broker.log.helpers import open_store
from tests.broker.log.test_cleaner import COMPACT, latest_per_key, part, produce, read_like_a_consumer

TOPIC_DIR = "c-0"


async def make_image(root: Path) -> None:
    store = await open_store(root)
    store.create_topic("c", 1, COMPACT.with_kafka_configs({"flush.policy": "os", "segment.bytes": "16384"}))
    for start in range(0, 6000, 20):
        records = [RecordSpec(b"v%d-%s" % (i, b"x" * (i % 90)), key=b"k%d" % (i % 50))
                   for i in range(start, start + 20)]
        await store.append("c", 0, encode_batch(records))
    await produce(store, "c", [(b"k%d" % i, None) for i in range(0, 50, 7)])  # tombstones, kept (fresh)
    await produce(store, "c", [(b"tail", b"y" * 300)] * 60)
    await store.close()


def segment_files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / TOPIC_DIR).glob("*.log"))}


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen[bytes]) -> bool:
    """Poll ``condition`` while the child runs; False if the child finished first."""
    deadline = time.monotonic() + 30
    while not condition():
        if proc.poll() is not None:
            return False
        assert time.monotonic() < deadline
        time.sleep(0.0005)
    return True


def tmp_files_exist(root: Path) -> bool:
    return any((root / TOPIC_DIR).glob("*.clean.tmp"))


def first_segment_replaced(root: Path, original_inode: int) -> Callable[[], bool]:
    path = root / TOPIC_DIR / f"{0:020d}.log"
    return lambda: path.stat().st_ino != original_inode


@pytest.mark.parametrize("moment", ["while-building", "while-swapping"])
async def test_kill9_mid_clean_leaves_old_or_new_segments(
    tmp_path: Path, moment: str, caplog: pytest.LogCaptureFixture
) -> None:
    image = tmp_path / "image"
    await make_image(image)
    original = segment_files(image)
    # The reference: the same data cleaned without interruption.
    reference_root = tmp_path / "reference"
    shutil.copytree(image, reference_root)
    reference = await open_store(reference_root)
    expected = latest_per_key(read_like_a_consumer(part(reference)))
    assert await LogCleaner(reference).clean_once()
    await reference.close()
    cleaned = segment_files(reference_root)
    assert cleaned != original

    for attempt in range(5):  # a loaded machine may not run this process while the child cleans: again
        root = tmp_path / f"run-{attempt}"
        shutil.copytree(image, root)
        inode = (root / TOPIC_DIR / f"{0:020d}.log").stat().st_ino
        proc = subprocess.Popen([sys.executable, "-m", "tests.broker.log.clean_child", str(root)],
                                stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        building = functools.partial(tmp_files_exist, root)
        caught = wait_until(building if moment == "while-building" else first_segment_replaced(root, inode), proc)
        proc.kill()
        proc.wait()
        if caught:
            break
    assert caught, "the child finished before the kill point, 5 times"

    now = segment_files(root)
    assert set(now) == set(original)
    states = {name: "old" if data == original[name] else "new" if data == cleaned[name] else "MIX"
              for name, data in now.items()}
    assert "MIX" not in states.values(), states
    if moment == "while-swapping":
        assert states[f"{0:020d}.log"] == "new"
    with caplog.at_level(logging.WARNING):
        store: SegmentLogStore = await open_store(root)
    assert "truncated" not in caplog.text
    assert not tmp_files_exist(root)  # recovery removed the unfinished copies
    seen = read_like_a_consumer(part(store))
    assert latest_per_key(seen) == expected
    assert await LogCleaner(store).clean_once() is not None  # and cleaning can carry on
    assert latest_per_key(read_like_a_consumer(part(store))) == expected
    await store.close()
