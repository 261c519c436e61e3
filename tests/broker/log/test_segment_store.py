"""The segment-file store beyond the shared contract: rolls, indexes, retention, restarts, flush policies."""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import broker.log.segment_partition as segment_module
from broker.log.config import FlushPolicy, TopicConfig
from broker.log.segment import SegmentLogStore, SegmentPartitionLog
from broker.protocol.records import RecordSpec, decode_all, encode_batch
from tests.broker.log.helpers import FakeClock, Model, all_records, index_files, open_store, random_batch

SMALL = TopicConfig(segment_bytes=2048, index_interval_bytes=256)


def seg_log(store: SegmentLogStore, topic: str = "t", p: int = 0) -> SegmentPartitionLog:
    log = store.partition(topic, p)
    assert isinstance(log, SegmentPartitionLog)
    return log


async def fill(store: SegmentLogStore, model: Model, count: int, seed: int, topic: str = "t") -> None:
    rng = random.Random(seed)
    for i in range(count):
        data, values, max_ts = random_batch(rng, len(model.batches), 1_000_000 + 100 * (len(model.batches) + i))
        result = await store.append(topic, 0, data)
        model.add(result.base_offset, values, max_ts)


def check_against(log: SegmentPartitionLog, model: Model) -> None:
    assert log.high_watermark == model.end
    records = all_records(log)
    assert [(r.offset, r.value) for r in records] == model.values_from(log.log_start_offset)
    for base, last, _, values in model.batches[:: max(1, len(model.batches) // 40)]:
        if last < log.log_start_offset:
            continue
        for offset in (base, last):
            first = decode_all(log.read(offset, 1))  # one whole batch even though max_bytes is 1
            assert [r.value for r in first] == values
    lo = min(b[2] for b in model.batches) - 1
    hi = max(b[2] for b in model.batches) + 1
    for target in range(lo, hi + 1, max(1, (hi - lo) // 60)):
        assert log.offset_for_timestamp(target) == model.offset_for_timestamp(target, log.log_start_offset)
    assert log.offset_for_timestamp(hi) is None


async def test_append_read_and_seek_by_time_across_rolls_survive_restart(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    store.create_topic("t", 1, SMALL)
    model = Model()
    await fill(store, model, 300, seed=1)
    log = seg_log(store)
    assert log.segment_count > 10
    check_against(log, model)
    await store.close()
    before = index_files(tmp_path / "t-0")

    store = await open_store(tmp_path)
    assert store.recovery_stats["clean"] == 1 and store.recovery_stats["scanned_bytes"] == 0
    log = seg_log(store)
    check_against(log, model)
    assert index_files(tmp_path / "t-0") == before  # closed indexes untouched, active one rewritten identically
    await fill(store, model, 50, seed=2)  # appends continue with the right offsets
    check_against(log, model)
    await store.close()


async def test_segment_rolls_by_age_and_the_age_survives_restart(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await open_store(tmp_path, clock=clock)
    store.create_topic("t", 1, TopicConfig(segment_ms=1000))
    log = seg_log(store)
    await store.append_records("t", [RecordSpec(b"a")], partition=0)
    clock.now += 0.5
    await store.append_records("t", [RecordSpec(b"b")], partition=0)
    assert log.segment_count == 1
    await store.close()

    store = await open_store(tmp_path, clock=clock)
    log = seg_log(store)
    clock.now += 0.6  # 1.1 s after the segment was created, 0.6 s after the restart
    await store.append_records("t", [RecordSpec(b"c")], partition=0)
    assert log.segment_count == 2
    assert [r.value for r in all_records(log)] == [b"a", b"b", b"c"]
    await store.close()


async def test_retention_by_time_drops_old_closed_segments_only(tmp_path: Path) -> None:
    clock = FakeClock()
    store = await open_store(tmp_path, clock=clock)
    store.create_topic("t", 1, TopicConfig(segment_bytes=1024, retention_ms=60_000))
    log = seg_log(store)
    for i in range(12):
        await store.append_records("t", [RecordSpec(bytes([i]) * 300)], partition=0)
    old_segments = log.segment_count - 1
    clock.now += 120
    for i in range(6):
        await store.append_records("t", [RecordSpec(bytes([100 + i]) * 300)], partition=0)
    assert store.enforce_retention(int(clock.now * 1000) - 90_000) == 0  # nothing is 60 s old yet then
    removed = store.enforce_retention(int(clock.now * 1000))
    assert removed > 0
    # two ~370-byte batches per segment: the six segments last written 120 s ago go, the three new stay
    assert old_segments == 5 and removed == 12 * (log.size_bytes // 6)
    assert log.log_start_offset == 12 and log.segment_count == 3 and log.high_watermark == 18
    values = [r.value for r in all_records(log)]
    assert values[-6:] == [bytes([100 + i]) * 300 for i in range(6)]
    remaining_logs = sorted(p.name for p in (tmp_path / "t-0").glob("*.log"))
    assert len(remaining_logs) == log.segment_count
    # even far in the future the active segment stays
    store.enforce_retention(int(clock.now * 1000) + 10**9)
    assert log.segment_count == 1 and log.high_watermark == 18
    await store.close()


async def test_retention_by_time_after_restart_uses_file_times(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    store.create_topic("t", 1, TopicConfig(segment_bytes=1024, retention_ms=3_600_000))
    for i in range(10):
        await store.append_records("t", [RecordSpec(bytes([i]) * 300)], partition=0)
    await store.close()
    logs = sorted((tmp_path / "t-0").glob("*.log"))
    day_ago = os.stat(logs[0]).st_mtime - 86_400
    for path in logs[:2]:
        os.utime(path, (day_ago, day_ago))
    old_bytes = sum(p.stat().st_size for p in logs[:2])
    store = await open_store(tmp_path)
    log = seg_log(store)
    assert store.enforce_retention() == old_bytes
    assert store.enforce_retention() == 0
    assert log.log_start_offset == int(logs[2].stem)
    assert not logs[0].exists() and not logs[1].exists() and logs[2].exists()
    await store.close()
    store = await open_store(tmp_path)
    assert seg_log(store).log_start_offset == int(logs[2].stem)
    await store.close()


async def test_retention_by_bytes_keeps_at_least_the_limit_and_persists(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    store.create_topic("t", 1, TopicConfig(segment_bytes=1024, retention_bytes=2500))
    for i in range(30):
        await store.append_records("t", [RecordSpec(bytes([i]) * 300)], partition=0)
    log = seg_log(store)
    total = log.size_bytes
    removed = store.enforce_retention()
    assert removed > 0 and log.size_bytes == total - removed
    assert 2500 <= log.size_bytes <= 2500 + 1024
    start = log.log_start_offset
    await store.close()
    store = await open_store(tmp_path)
    log = seg_log(store)
    assert log.log_start_offset == start and log.high_watermark == 30
    assert [r.offset for r in all_records(log)] == list(range(start, 30))
    await store.close()


async def test_missing_or_corrupt_index_files_are_rebuilt(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    store.create_topic("t", 1, SMALL)
    model = Model()
    await fill(store, model, 200, seed=5)
    await store.close()
    directory = tmp_path / "t-0"
    originals = index_files(directory)
    stems = sorted(p.stem for p in directory.glob("*.log"))
    assert len(stems) >= 6
    (directory / f"{stems[0]}.index").unlink()
    (directory / f"{stems[1]}.timeindex").write_bytes(random.Random(1).randbytes(60))
    raw = (directory / f"{stems[2]}.index").read_bytes()
    (directory / f"{stems[2]}.index").write_bytes(raw[:-3])  # torn entry
    shifted = bytearray(raw)
    for i in range(4, len(shifted), 8):  # every position moved by one byte: monotonic, but wrong
        shifted[i + 3] = (shifted[i + 3] + 1) % 256
    (directory / f"{stems[3]}.index").write_bytes(bytes(shifted))
    (directory / f"{stems[-1]}.index").unlink()  # the active segment's
    (directory / f"{stems[-1]}.timeindex").write_bytes(b"\x00" * 7)

    store = await open_store(tmp_path)
    check_against(seg_log(store), model)  # reads and time lookups load, detect and rebuild
    assert index_files(directory) == originals
    await store.close()


async def test_flush_always_shares_one_fsync_between_concurrent_appends(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    store.create_topic("t", 1, TopicConfig(flush=FlushPolicy.ALWAYS))
    log = seg_log(store)
    results = await asyncio.gather(*(store.append_records("t", [RecordSpec(b"%d" % i)], partition=0)
                                     for i in range(200)))
    assert sorted(r.base_offset for r in results) == list(range(200))
    assert 1 <= log.flusher.syncs <= 5
    assert log.recovery_point.position == log.size_bytes
    await store.close()


async def test_appends_during_an_fsync_wait_for_the_next_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    calls: list[int] = []
    real: Callable[[list[int], list[Path]], None] = segment_module._fsync_all

    def gated(files: list[int], dirs: list[Path]) -> None:
        calls.append(len(files) + len(dirs))
        gate.wait(10)
        real(files, dirs)

    monkeypatch.setattr(segment_module, "_fsync_all", gated)
    store = await open_store(tmp_path)
    store.create_topic("t", 1, TopicConfig(flush=FlushPolicy.ALWAYS))
    log = seg_log(store)
    first = asyncio.create_task(store.append_records("t", [RecordSpec(b"a")], partition=0))
    while not calls:  # the first fsync is running (blocked in its thread)
        await asyncio.sleep(0.001)
    later = [asyncio.create_task(store.append_records("t", [RecordSpec(b"%d" % i)], partition=0))
             for i in range(3)]
    await asyncio.sleep(0.01)
    assert not first.done() and not any(t.done() for t in later)
    assert log.recovery_point.position == 0
    gate.set()
    await first
    assert log.flusher.syncs == 1 and not any(t.done() for t in later)  # that fsync did not cover them
    await asyncio.gather(*later)
    assert log.flusher.syncs == 2 and len(calls) == 2  # one more fsync for all three
    assert log.recovery_point.position == log.size_bytes
    await store.close()


async def test_a_marked_wait_ends_with_the_fsync_that_covers_its_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pipelined Produce: a request's writes are marked at dispatch and its answer waits later, after
    newer requests wrote too. Its wait must end with the fsync covering its own writes, not need one
    more for theirs."""
    turns = threading.Semaphore(0)  # one release lets one fsync round finish
    calls: list[int] = []
    real: Callable[[list[int], list[Path]], None] = segment_module._fsync_all

    def gated(files: list[int], dirs: list[Path]) -> None:
        calls.append(len(files) + len(dirs))
        turns.acquire(timeout=10)
        real(files, dirs)

    async def until_fsync_calls(n: int) -> None:
        while len(calls) < n:
            await asyncio.sleep(0.001)

    monkeypatch.setattr(segment_module, "_fsync_all", gated)
    store = await open_store(tmp_path)
    store.create_topic("t", 1, TopicConfig(flush=FlushPolicy.ALWAYS))
    log = seg_log(store)
    log.append_nowait(encode_batch([RecordSpec(b"a")]))
    wait_a = asyncio.create_task(log.wait_durable(log.write_mark()))
    await until_fsync_calls(1)
    log.append_nowait(encode_batch([RecordSpec(b"b")]))  # written while fsync 1 runs
    mark_b = log.write_mark()
    turns.release()
    await wait_a
    log.flusher.kick()  # fsync 2 starts: it covers b
    await until_fsync_calls(2)
    log.append_nowait(encode_batch([RecordSpec(b"c")]))  # written while fsync 2 runs
    wait_b = asyncio.create_task(log.wait_durable(mark_b))  # asked only now, after c was written
    turns.release()
    await asyncio.wait_for(wait_b, 5)
    assert log.flusher.syncs == 2 and len(calls) == 2  # b's wait did not start a third round for c
    assert log.flusher.pending  # c is still unsynced
    turns.release()
    await log.wait_durable()
    assert not log.flusher.pending and log.flusher.syncs == 3
    await store.close()


async def test_flush_interval_syncs_in_the_background(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    store.create_topic("t", 1, TopicConfig(flush=FlushPolicy.INTERVAL, flush_interval_ms=30))
    log = seg_log(store)
    await store.append_records("t", [RecordSpec(b"x")], partition=0)
    assert log.recovery_point.position == 0 and log.flusher.pending  # acknowledged before any fsync
    deadline = asyncio.get_running_loop().time() + 5
    while log.recovery_point.position < log.size_bytes:
        assert asyncio.get_running_loop().time() < deadline, "interval flush never happened"
        await asyncio.sleep(0.005)
    assert log.flusher.syncs == 1
    await store.close()


async def test_flush_os_syncs_only_on_roll_and_on_request(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    store.create_topic("t", 1, TopicConfig(flush=FlushPolicy.OS, segment_bytes=1024))
    log = seg_log(store)
    for _ in range(3):
        await store.append_records("t", [RecordSpec(b"y" * 250)], partition=0)
    for _ in range(5):
        await asyncio.sleep(0)
    assert log.flusher.syncs == 0 and log.recovery_point.position == 0
    await store.append_records("t", [RecordSpec(b"y" * 250)], partition=0)  # rolls: old segment gets synced
    assert log.segment_count == 2
    deadline = asyncio.get_running_loop().time() + 5
    while log.flusher.syncs == 0:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.005)
    assert log.recovery_point.segment == 3
    await store.append_records("t", [RecordSpec(b"y" * 250)], partition=0)
    await log.flush()
    active = tmp_path / "t-0" / f"{3:020d}.log"
    assert (log.recovery_point.segment, log.recovery_point.offset) == (3, 5)
    assert log.recovery_point.position == active.stat().st_size
    await store.close()


async def test_altered_config_survives_restart_and_switches_the_flush_policy(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    store.create_topic("t", 1, TopicConfig(flush=FlushPolicy.ALWAYS))
    await store.append("t", 0, encode_batch([RecordSpec(b"x")]))
    await store.alter_topic_config("t", TopicConfig(flush=FlushPolicy.OS, retention_ms=1234))
    assert seg_log(store).flusher.policy is FlushPolicy.OS
    await store.close()
    reopened = await open_store(tmp_path)
    assert reopened.topic("t").config.retention_ms == 1234
    assert seg_log(reopened).flusher.policy is FlushPolicy.OS
    await reopened.close()


async def test_deleted_records_stay_deleted_after_restart_and_whole_segments_go(tmp_path: Path) -> None:
    store = await open_store(tmp_path)
    store.create_topic("t", 1, SMALL)
    model = Model()
    await fill(store, model, 120, seed=7)
    log = seg_log(store)
    segments = log.segment_count
    cut = model.batches[len(model.batches) // 2][0] + 1  # inside a batch, past several segments
    assert await log.delete_records(cut) == cut
    assert log.segment_count < segments, "segments wholly below the new log start are removed"
    check_against(log, model)
    await store.close()
    reopened = await open_store(tmp_path)
    log = seg_log(reopened)
    assert log.log_start_offset == cut
    check_against(log, model)
    await reopened.close()


async def test_a_stray_log_file_named_with_non_ascii_digits_is_not_a_segment(tmp_path: Path) -> None:
    """``"²".isdigit()`` is true but ``int("²")`` fails: such a name (a stray file, a bad restore) is not
    one of our segments, and the partition opens with its real ones (it raised ValueError at start)."""
    store = await open_store(tmp_path)
    store.create_topic("t", 1, SMALL)
    model = Model()
    await fill(store, model, 20, seed=3)
    await store.close()
    (tmp_path / "t-0" / ("²" * 20 + ".log")).write_bytes(b"not a segment")
    store = await open_store(tmp_path)
    check_against(seg_log(store), model)
    await store.close()
