"""Issue 17, item 4: keyed state beyond the in-memory bound spills to RocksDB
(``RunnerConfig.state_max_keys``, ``processors.state_store``). A pipeline over 20x more keys than
the bound gives the results of the all-in-memory pipeline, across a restart in the middle (state
restored from the checkpoint, the spill store being scratch)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from broker.log.memory import MemoryLogStore
from broker.protocol.records import RecordSpec
from processors.aggregations import Mean
from processors.checkpoint import CheckpointCodec, load_from_tail, restore_executor, take_checkpoint
from processors.errors import CheckpointError
from processors.executor import Executor
from processors.hosting import AttachedRunner
from processors.operators import KeyedProcessFunction, ProcessContext
from processors.pipeline import Pipeline
from processors.runner import RunnerConfig
from processors.state_store import SpillingLogics, spilling_factory
from processors.testing import FakeClock
from processors.watermarks import AllIdlePolicy, BoundedOutOfOrderness
from processors.windows import Tumbling
from tests.processors.test_runner import read_topic, wait_until
from tests.processors.workloads import T0

KEYS = 1_000
BOUND = 50


def pipeline() -> Pipeline:
    stream = Pipeline.source("readings", group="spill", event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(1_000))
    (stream.key_by(lambda v: v["k"]).window(Tumbling(10_000)).aggregate(Mean("x")).sink("means"))
    return stream.pipeline


def rows(start_s: int, end_s: int) -> list[dict[str, Any]]:
    rng = random.Random(start_s)
    return [{"k": f"key-{rng.randrange(KEYS)}", "x": rng.randrange(100), "ts": T0 + s * 1_000 + j}
            for s in range(start_s, end_s) for j in range(0, 1_000, 2)]


async def feed(store: MemoryLogStore, batch: list[dict[str, Any]]) -> None:
    for i in range(0, len(batch), 1_000):
        specs = [RecordSpec(json.dumps(r).encode(), r["k"].encode(), (), r["ts"]) for r in batch[i:i + 1_000]]
        await store.append_records("readings", specs, partition=0)


def batch_means(batch: list[dict[str, Any]]) -> dict[tuple[Any, ...], float]:
    sums: dict[tuple[Any, ...], list[float]] = {}
    for r in batch:
        start = (r["ts"] - T0) // 10_000 * 10_000 + T0
        acc = sums.setdefault((start, r["k"]), [0.0, 0])
        acc[0] += r["x"]
        acc[1] += 1
    return {k: total / n for k, (total, n) in sums.items()}


def results(store: MemoryLogStore) -> dict[tuple[Any, ...], float]:
    out = {}
    for r in read_topic(store, "means"):
        out[(r["window_start"], r["key"])] = r["value"]
    return out


async def run(config: RunnerConfig, *, restart: bool) -> tuple[dict[tuple[Any, ...], float], list[int]]:
    store = MemoryLogStore()
    store.create_topic("readings", 1)
    clock = FakeClock()
    first, second = rows(0, 25), rows(25, 45)
    end = [{"k": "key-0", "x": 0, "ts": T0 + 60_000}]  # closes every window before 50 s
    spilled = []
    runner = AttachedRunner(pipeline(), store, clock=clock, config=config)
    await runner.start()
    await feed(store, first)
    await wait_until(lambda: runner.executor.records_in == len(first))
    if restart:
        clock.advance(2_000)  # a checkpoint is due
        await wait_until(lambda: runner.checkpoints_written > 0 and runner.executor.records_in == len(first))
        spilled.append(_spilled(runner))
        await runner.stop()
        runner = AttachedRunner(pipeline(), store, clock=clock, config=config)
        await runner.start()
    await feed(store, second + end)
    total = len(second) + 1 + (0 if restart else len(first))
    await wait_until(lambda: runner.executor.records_in == total)
    await wait_until(lambda: len(results(store)) == len(batch_means(first + second)))
    spilled.append(_spilled(runner))
    await runner.stop()
    return results(store), spilled


def _spilled(runner: AttachedRunner) -> int:
    logics = [node.rt.logics for node in runner.executor.keyed.values()]
    assert all(len(getattr(m, "_hot", {})) <= BOUND for m in logics)
    return sum(m.spilled for m in logics if isinstance(m, SpillingLogics))


async def test_more_keys_than_the_bound_give_the_in_memory_results_across_a_restart(tmp_path: Path) -> None:
    in_memory, _ = await run(RunnerConfig(tick_ms=100, checkpoint_interval_ms=1_000), restart=False)
    bounded = RunnerConfig(tick_ms=100, checkpoint_interval_ms=1_000, state_max_keys=BOUND,
                           state_dir=str(tmp_path / "state"))
    spilling, spilled = await run(bounded, restart=True)
    assert len(in_memory) > 4 * KEYS  # windows of 10 s over 45 s, every key in each
    assert spilling == in_memory == pytest.approx(batch_means(rows(0, 25) + rows(25, 45)))
    assert all(n > KEYS for n in spilled), spilled  # both runs spilled (the bound held)


class _Rec:
    __slots__ = ("headers", "key", "offset", "timestamp", "value")

    def __init__(self, offset: int, value: dict[str, Any]) -> None:
        self.offset, self.timestamp, self.key, self.value, self.headers = offset, value["ts"], None, \
            json.dumps(value).encode(), ()


class _Timers(KeyedProcessFunction):
    """Counts per key; an event timer at the end of the first 10 s and a processing-time timer at
    1,000 (ms of processing time) per key."""

    def process(self, value: Any, ctx: ProcessContext) -> None:
        ctx.value("n").set((ctx.value("n").get() or 0) + 1)
        ctx.register_event_timer(T0 + 9_999)
        ctx.register_processing_timer(1_000)

    def on_timer(self, timestamp: int, ctx: ProcessContext, domain: str) -> None:
        ctx.emit({"key": ctx.key, "domain": domain, "n": ctx.value("n").get()}, T0)


def test_the_bound_covers_owners_and_timers_and_spilled_timers_fire(tmp_path: Path) -> None:
    """Every per-key structure is bounded by ``state_max_keys``: owners and timer heap entries of
    spilled keys live on disk with their state (they used to stay in memory for every key), and the
    timers of spilled keys still fire, event-time and processing-time."""
    keys, bound = 3_000, 20
    stream = Pipeline.source("in", group="timers", event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(0), all_idle=AllIdlePolicy.HOLD)
    stream.key_by(lambda v: v["k"], repartition=False).process(_Timers()).sink("out")
    ex = Executor(stream.pipeline, 0, keyed_state=spilling_factory(bound, tmp_path / "state"))
    tp = ("in", 0)
    ex.add_partition(tp, 0)
    ex.process(tp, [_Rec(i, {"k": f"k{i}", "ts": T0}) for i in range(keys)], 0)
    [node] = ex.keyed.values()
    rt, store = node.rt, node.rt.logics
    assert isinstance(store, SpillingLogics) and len(store) == keys and store.in_memory <= bound
    # owners of spilled keys are in their disk records (they were a dict of every key)
    assert len(rt.owner if isinstance(rt.owner, dict) else store._owner) <= bound
    assert len(rt.event_timers) <= 2 * bound + 1024 and len(rt.proc_timers) <= 2 * bound + 1024
    [entries] = ex.snapshot().values()
    assert rt.owner["k0"] == tp and len(entries) == keys and {e[1] for e in entries} == {tp}

    ex.tick(1_000)  # processing time reaches every key's timer, spilled or not
    proc = [json.loads(r.value or b"") for r in ex.take_outputs()]
    ex.process(tp, [_Rec(keys, {"k": "mover", "ts": T0 + 10_000})], 1_000)  # the watermark passes 9,999
    event = [json.loads(r.value or b"") for r in ex.take_outputs()]
    event = [r for r in event if r["key"] != "mover"]
    assert sorted(r["key"] for r in proc if r["domain"] == "processing") == sorted(f"k{i}" for i in range(keys))
    assert sorted(r["key"] for r in event if r["domain"] == "event") == sorted(f"k{i}" for i in range(keys))
    assert [r for r in proc + event if r["n"] != 1] == []
    assert store.in_memory <= bound and len(store._owner) <= bound
    assert len(rt.event_timers) <= 2 * bound + 1024 and len(rt.proc_timers) <= 2 * bound + 1024
    ex.close()


def _windows_executor(directory: Path, bound: int) -> Executor:
    stream = Pipeline.source("in", group="inc", event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(0), all_idle=AllIdlePolicy.HOLD)
    stream.key_by(lambda v: v["k"], repartition=False).window(Tumbling(60_000)).aggregate(Mean("x")).sink("out")
    return Executor(stream.pipeline, 0, keyed_state=spilling_factory(bound, directory))


def test_incremental_checkpoints_write_the_changed_keys_and_restore_base_plus_delta(tmp_path: Path) -> None:
    """With a spill store a checkpoint holds the keys changed since a base (and those gone), not every
    key; restoring the newest head on top of its base gives exactly the state a full checkpoint has."""
    keys, bound, tp = 2_000, 50, ("in", 0)
    ex = _windows_executor(tmp_path / "a", bound)
    ex.add_partition(tp, 0)
    ex.process(tp, [_Rec(i, {"k": f"k{i}", "x": i, "ts": T0}) for i in range(keys)], 0)
    codec = CheckpointCodec()
    log: list[tuple[bytes, bytes | None]] = []

    def checkpoint(offset: int) -> int:
        records = codec.encode(take_checkpoint("inc", ex, {tp: offset}, 0, codec.delta))
        log.extend(records)
        return sum(len(k) + len(v or b"") for k, v in records)

    full = checkpoint(keys)  # the first one is a base
    ex.process(tp, [_Rec(keys + i, {"k": f"k{i}", "x": 1_000, "ts": T0 + 1}) for i in range(20)], 0)
    small = checkpoint(keys + 20)  # 20 keys changed: a head with their state only
    ex.process(tp, [_Rec(keys + 20 + i, {"k": f"k{i}", "x": 7, "ts": T0 + 2}) for i in range(10, 30)], 0)
    small2 = checkpoint(keys + 40)  # cumulative: the 30 keys changed since the base
    assert small < full / 20 and small < small2 < full / 10, (full, small, small2)

    restored = CheckpointCodec().decode(log)[tp]
    assert restored.offset == keys + 40 and restored.base is not None
    assert sorted(restored.touched["1"]) == sorted(f"k{i}" for i in range(30))
    other = _windows_executor(tmp_path / "b", bound)
    restore_executor(other, [(tp, restored)], 0)
    assert sorted(map(repr, other.snapshot()["1"])) == sorted(map(repr, ex.snapshot()["1"]))
    # keys that go away (their windows closed) are listed gone, and stay gone after a restore
    ex.process(tp, [_Rec(keys + 40, {"k": "k0", "x": 0, "ts": T0 + 61_000})], 0)
    checkpoint(keys + 41)
    after = CheckpointCodec().decode(log)[tp]
    assert [e[0] for e in after.ops["1"]] == ["k0"]  # only k0's new window is left
    ex.close()
    other.close()


async def test_a_restore_reads_back_to_the_base_of_the_newest_incremental_checkpoint(tmp_path: Path) -> None:
    """The restore reads the checkpoint log from its tail; a head whose base lies further back makes it
    read further (an older self-contained checkpoint found first must not stand in for it: its
    results may be committed already), and a base the log lost is an error, not a silent fallback."""
    tp = ("in", 0)
    ex = _windows_executor(tmp_path / "a", 10)
    ex.add_partition(tp, 0)
    ex.process(tp, [_Rec(i, {"k": f"k{i}", "x": i, "ts": T0}) for i in range(100)], 0)
    codec = CheckpointCodec()
    log = codec.encode(take_checkpoint("inc", ex, {tp: 100}, 0, codec.delta))  # a base and its head
    for n in range(80):  # many small heads after it: the base is far from the tail
        ex.process(tp, [_Rec(100 + n, {"k": "k1", "x": n, "ts": T0 + 1})], 0)
        log += codec.encode(take_checkpoint("inc", ex, {tp: 101 + n}, 0, codec.delta))
        if n == 30:  # a self-contained checkpoint in between (as a version without increments wrote)
            log += CheckpointCodec().encode(take_checkpoint("inc", ex, {tp: 101 + n}, 0))

    async def read(lo: int, hi: int) -> list[tuple[bytes, bytes | None]]:
        return log[lo:hi]

    restored = await load_from_tail(read, 0, len(log), [tp], CheckpointCodec())
    assert restored[tp].offset == 180 and restored[tp].base is not None
    first_base = next(i for i, (k, _) in enumerate(log) if b":b" in k)
    with pytest.raises(CheckpointError, match="no longer holds"):
        await load_from_tail(read, first_base + 1, len(log), [tp], CheckpointCodec())
    ex.close()
