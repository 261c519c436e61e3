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
from processors.hosting import AttachedRunner
from processors.pipeline import Pipeline
from processors.runner import RunnerConfig
from processors.state_store import SpillingLogics
from processors.testing import FakeClock
from processors.watermarks import BoundedOutOfOrderness
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
