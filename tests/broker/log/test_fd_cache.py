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


def _open_files_under(root: Path) -> int:
    """Descriptors of this process open on files under ``root``: what the store holds, whatever else the
    process opens or closes meanwhile (objects of earlier tests closing theirs as they are collected)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # closed meanwhile (the listing's own descriptor among them)
            continue
        count += target.startswith(f"{root}/")
    return count


@pytest.mark.parametrize("flush", [FlushPolicy.ALWAYS, FlushPolicy.OS])
async def test_many_partitions_and_segments_within_a_small_fd_bound(tmp_path: Path, flush: FlushPolicy) -> None:
    rng = random.Random(7)
    store = await open_store(tmp_path, max_open_files=16)
    store.create_topic("t", 60, TopicConfig(flush=flush, segment_bytes=500))
    expected: dict[int, list[bytes]] = {p: [] for p in range(60)}
    for i in range(420):  # ~7 records per partition, several segments each, in random order
        p = rng.randrange(60)
        value = b"%d-%d-" % (p, i) + b"." * rng.randrange(10, 120)
        await store.append_records("t", [RecordSpec(value)], partition=p)
        expected[p].append(value)
        assert store.fds.open_count <= 16
    assert _open_files_under(tmp_path) <= 16 + 2  # + the data-dir lock and the checkpoint being written
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


async def test_running_out_of_descriptors_frees_idle_segment_files_and_retries(tmp_path: Path) -> None:
    """EMFILE while sockets or other code used the headroom: the cache closes idle segment files and the
    open is tried again, so the append succeeds instead of failing the partition."""
    import resource

    store = await open_store(tmp_path, max_open_files=10_000)  # a bound that never trims by itself
    store.create_topic("held", 40, TopicConfig(flush=FlushPolicy.OS))
    for p in range(40):
        await store.append_records("held", [RecordSpec(b"h")], partition=p)
    held = store.fds.open_count
    assert held >= 40
    store.create_topic("fresh", 5, TopicConfig(flush=FlushPolicy.OS))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (_open_fds() + 1, hard))  # one descriptor of headroom
    try:
        for p in range(5):  # each needs three new files
            await store.append_records("fresh", [RecordSpec(b"f%d" % p)], partition=p)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert store.fds.open_count < held
    for p in range(5):
        assert [r.value for r in all_records(store.partition("fresh", p))] == [b"f%d" % p]
    assert [r.value for r in all_records(store.partition("held", 39))] == [b"h"]
    await store.close()
