"""Segment files under a small descriptor bound: data stays right while descriptors come and go."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from broker.log.config import FlushPolicy, TopicConfig
from broker.protocol.records import RecordSpec
from tests.broker.log.helpers import all_records, open_store


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("flush", [FlushPolicy.ALWAYS, FlushPolicy.OS])
async def test_many_partitions_and_segments_within_a_small_fd_bound(tmp_path: Path, flush: FlushPolicy) -> None:
    rng = random.Random(7)
    before = _open_fds()
    store = await open_store(tmp_path, max_open_files=16)
    store.create_topic("t", 60, TopicConfig(flush=flush, segment_bytes=500))
    expected: dict[int, list[bytes]] = {p: [] for p in range(60)}
    for i in range(420):  # ~7 records per partition, several segments each, in random order
        p = rng.randrange(60)
        value = b"%d-%d-" % (p, i) + b"." * rng.randrange(10, 120)
        await store.append_records("t", [RecordSpec(value)], partition=p)
        expected[p].append(value)
        assert store.fds.open_count <= 16
    assert _open_fds() - before <= 16 + 2  # + the data-dir lock and the checkpoint being written
    for p in rng.sample(range(60), 20):  # reads reopen closed segments (and their indexes)
        assert [r.value for r in all_records(store.partition("t", p))] == expected[p]
    await store.flush()  # dirty segments whose descriptors were closed are reopened to be fsynced
    await store.close()
    assert store.fds.open_count == 0 and store.fds.evictions > 0
    store = await open_store(tmp_path, max_open_files=16)
    assert store.recovery_stats["truncated_bytes"] == 0
    for p in range(60):
        assert [r.value for r in all_records(store.partition("t", p))] == expected[p]
    assert store.fds.open_count <= 16
    await store.close()
