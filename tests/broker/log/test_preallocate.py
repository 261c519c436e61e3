"""Segment preallocation (``preallocate_bytes``): disk blocks reserved ahead of the active segment's end,
the file size untouched (so readers and recovery see the same file), the unused part given back when the
segment rolls and when the partition closes. Kill -9 with it: ``test_kill9`` (odd runs preallocate)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.log.config import TopicConfig
from broker.log.files import reserve_blocks
from broker.log.segment import SegmentLogStore
from broker.protocol.records import RecordSpec
from tests.broker.log.helpers import all_records

RESERVE = 1 << 20


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


@pytest.fixture
def can_reserve(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT)
    try:
        if reserve_blocks(fd, 0, 4096) != 0:
            pytest.skip("this file system cannot reserve blocks (fallocate)")
    finally:
        os.close(fd)
        probe.unlink()


async def test_blocks_are_reserved_ahead_the_size_does_not_move_and_roll_and_close_give_them_back(
    tmp_path: Path, can_reserve: None
) -> None:
    store = SegmentLogStore(tmp_path, preallocate_bytes=RESERVE)
    await store.start()
    store.create_topic("t", 1, TopicConfig(segment_bytes=256 * 1024))
    log = store.partition("t", 0)
    directory = tmp_path / "t-0"
    value = b"v" * 1000
    await store.append_records("t", [RecordSpec(value)], partition=0)
    (first,) = sorted(directory.glob("*.log"))
    assert os.stat(first).st_size == log.size_bytes  # what readers and recovery go by
    assert allocated(first) >= RESERVE
    while len(list(directory.glob("*.log"))) < 2:
        await store.append_records("t", [RecordSpec(value)] * 50, partition=0)
    assert allocated(first) < os.stat(first).st_size + 64 * 1024  # rolled: the rest went back
    (_, second) = sorted(directory.glob("*.log"))
    assert allocated(second) >= RESERVE
    written = log.high_watermark
    await store.close()
    assert allocated(second) < os.stat(second).st_size + 64 * 1024  # closed: given back too
    reopened = SegmentLogStore(tmp_path, preallocate_bytes=RESERVE)
    await reopened.start()
    try:
        records = all_records(reopened.partition("t", 0))
        assert [r.offset for r in records] == list(range(written)) and {r.value for r in records} == {value}
    finally:
        await reopened.close()


async def test_without_preallocation_nothing_is_reserved(tmp_path: Path) -> None:
    store = SegmentLogStore(tmp_path)
    await store.start()
    try:
        store.create_topic("t", 1, TopicConfig())
        await store.append_records("t", [RecordSpec(b"v" * 1000)], partition=0)
        (path,) = (tmp_path / "t-0").glob("*.log")
        assert allocated(path) < 64 * 1024
    finally:
        await store.close()
