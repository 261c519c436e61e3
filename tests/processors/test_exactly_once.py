"""Issue 17, item 1: ``sluice process --guarantee exactly-once`` against a real Sluice. Each checkpoint
interval is one Kafka transaction (results, checkpoint, input offsets): kill -9 of the processor at
seeded random points, several rounds, and a read_committed reader still sees every (window, key)
result exactly once, equal to the batch computation."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.broker.server.conftest import SluiceProcess
from tests.long_runs import sized
from tests.processors.clusters import TARGETS, sluice_or_external
from tests.processors.test_standalone import (
    PARTITIONS,
    Processor,
    finals,
    heartbeat_all,
    produce,
    read_all,
    sluice,
    topics,
    wait_for_windows,
)
from tests.processors.workloads import batch_window_means, sensor_readings

__all__ = ["sluice"]  # the fixture, imported for the tests below

pytestmark = pytest.mark.slow


@pytest.fixture(params=TARGETS)
def eos_bootstrap(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from sluice_or_external(request.param, tmp_path, PARTITIONS)


async def eos_topics(bootstrap: str) -> dict[str, str]:
    """The sensor example's topics, created with PARTITIONS partitions under fresh names (an external
    cluster keeps topics between runs, and its default partition count is its own)."""
    env = topics(f"eos-{uuid.uuid4().hex[:8]}")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [env["SENSORS_INPUT"], env["SENSORS_OUTPUT"], env["SENSORS_LATE"], env["SENSORS_ALERTS"]]
        await admin.create_topics([NewTopic(name, PARTITIONS, 1) for name in names])
    finally:
        await admin.close()
    return env
# 1 s intervals (the later flag wins over Processor's 0.3 s): the kills below land before or after a
# commit, so some cut an interval whose results are written but not committed
EXACTLY_ONCE = ("--guarantee", "exactly-once", "--instance-id", "eos-test", "--checkpoint-interval", "1")


async def test_kill_9_at_random_points_read_committed_sees_every_window_exactly_once(
        eos_bootstrap: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("SLUICE_TEST_SEED", "17"))
    rng = random.Random(seed)
    readings = sensor_readings(sized(60, 120))  # a kill every 3 000 readings: 2 kills (4 in bench_long_tests)
    expected = batch_window_means(readings, 10_000)
    env = await eos_topics(eos_bootstrap)
    instances: list[Processor] = []  # each with its own log: a rebalance may assign an instance twice

    def start() -> Processor:
        instances.append(Processor(eos_bootstrap, env, tmp_path / f"eos-{len(instances)}.log", *EXACTLY_ONCE))
        return instances[-1]

    proc = start()
    chunks = [readings[i : i + 1_000] for i in range(0, len(readings), 1_000)]
    kills = failed_restarts = frozen_in_open_transaction = redrawn = 0

    async def freeze_inside_open_transaction(proc: Processor, feeding: asyncio.Task[None]) -> OpenSpans:
        """Stop the processor (SIGSTOP) while its open transaction holds results (an alerts partition's high
        watermark past its last stable offset) and look again: stopped, it cannot commit, so the kill that
        follows cuts that transaction, unless an EndTxn it sent just before the stop is still on its way
        through the broker (the caller looks at the outcome). A commit that landed between the look and the
        stop lets it go on (SIGCONT; stopped for two offset look-ups, well inside its session timeout). The
        input comes in slices meanwhile, so there are new results to catch (10 s at most after it: a long
        pause would make every partition idle for the pipeline). Answers the open records' offsets."""
        tps = [TopicPartition(env["SENSORS_ALERTS"], p) for p in range(PARTITIONS)]
        ends = {level: AIOKafkaConsumer(bootstrap_servers=eos_bootstrap, isolation_level=level)
                for level in ("read_uncommitted", "read_committed")}
        for consumer in ends.values():
            await consumer.start()

        async def results_open() -> OpenSpans:
            high = await ends["read_uncommitted"].end_offsets(tps)
            stable = await ends["read_committed"].end_offsets(tps)
            return {tp: (stable[tp], high[tp]) for tp in tps if high[tp] > stable[tp]}

        try:
            until = time.monotonic() + 10
            while not feeding.done() or time.monotonic() < until:
                if await results_open():
                    proc.proc.send_signal(signal.SIGSTOP)
                    await asyncio.sleep(0.2)  # a commit sent just before the stop mostly lands before the look
                    if spans := await results_open():
                        return spans
                    proc.proc.send_signal(signal.SIGCONT)
                await asyncio.sleep(rng.uniform(0, 0.05))
            return {}
        finally:
            for consumer in ends.values():
                await consumer.stop()

    try:
        for i, chunk in enumerate(chunks):
            # the second round, and each later chunk until one has cut a transaction (a commit in flight at
            # the stop ends it committed), kills the processor stopped inside its open transaction
            freeze = kills == 1 or (kills > 1 and not frozen_in_open_transaction)
            if i % 3 != 1 and not (freeze and kills > 1):
                await produce(eos_bootstrap, env["SENSORS_INPUT"], chunk)
                continue
            redrawn += i % 3 != 1
            deadline = time.monotonic() + 60
            while not proc.restored():  # this instance owns the partitions
                assert time.monotonic() < deadline and proc.proc.poll() is None, proc.log.read_text()[-3000:]
                await asyncio.sleep(0.05)
            spans: OpenSpans = {}
            if not freeze and rng.random() < 0.5:
                feeding = asyncio.create_task(produce(eos_bootstrap, env["SENSORS_INPUT"], chunk))
                await asyncio.sleep(rng.uniform(0.1, 2.5))  # anywhere in its work
            else:  # inside an open transaction with results written (always in the second round)
                # once a transaction has committed (the next instance restores a checkpoint, not nothing)
                while not await read_all(eos_bootstrap, env["SENSORS_ALERTS"], "read_committed"):
                    assert time.monotonic() < deadline and proc.proc.poll() is None, proc.log.read_text()[-3000:]
                    await asyncio.sleep(0.3)
                feeding = asyncio.create_task(produce_in_slices(eos_bootstrap, env["SENSORS_INPUT"], chunk))
                spans = await freeze_inside_open_transaction(proc, feeding)
            proc.kill9()
            kills += 1
            await feeding
            # same instance id: its start fences the killed one and aborts the transaction it left open
            proc = start()
            if spans:  # that transaction's results, once decided: aborted (cut), or committed (it was ending)
                frozen_in_open_transaction += await aborted_among(eos_bootstrap, spans) > 0
        await heartbeat_all(eos_bootstrap, env["SENSORS_INPUT"], readings[-1]["ts"] + 60_000)
        # Like a supervisor (systemd, Kubernetes), restart an instance that exited 1: seen when aiokafka's
        # transactional producer kept refreshing metadata for one topic only, so batches for another found
        # no leader for 40 s (NotLeaderForPartitionError). A failed transaction aborts; nothing may repeat.
        deadline = time.monotonic() + 180
        while len(finals(await read_all(eos_bootstrap, env["SENSORS_OUTPUT"], "read_committed"))) < len(expected):
            assert time.monotonic() < deadline, proc.log.read_text()[-3000:]
            if proc.proc.poll() is not None:
                assert proc.proc.returncode == 1, proc.log.read_text()[-3000:]
                failed_restarts += 1
                proc = start()
            await asyncio.sleep(0.3)
    finally:
        assert proc.stop() == 0, proc.log.read_text()[-3000:]
    assert kills == sized(2, 4) + redrawn
    assert len(instances) == kills + 1 + failed_restarts
    restores = [i.restored() for i in instances]  # per instance, what each assignment restored
    assert all(restores) and restores[0][0] == "{}", restores
    assert any(r[0] != "{}" for r in restores[1:]), restores
    rows = await read_all(eos_bootstrap, env["SENSORS_OUTPUT"], "read_committed")
    uncommitted = await read_all(eos_bootstrap, env["SENSORS_OUTPUT"])
    print(f"seed {seed}: {failed_restarts} restarts after exit 1; restored offsets per start: {restores}; "
          f"read_committed {len(rows)} rows, "
          f"read_uncommitted {len(uncommitted)} (aborted intervals included), windows {len(expected)}")
    # exactly once: one row per (window, key), every one of them, each the batch result
    counts = Counter(tuple(r["_key"]) for r in rows)
    assert [k for k, n in counts.items() if n > 1] == []
    assert finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}
    for r in rows:
        assert tuple(r["_key"]) == (r["window_start"], r["window_end"], r["key"])
        assert r["_emit_header"] == r["emit"] == "first"
    # the alerts (one per jump, emitted as each reading is processed) too: each exactly once
    alerts = [(a["sensor"], a["ts"], a["temp"]) for a in
              await read_all(eos_bootstrap, env["SENSORS_ALERTS"], "read_committed")]
    assert sorted(alerts) == batch_jump_alerts(readings)
    # the kills did cut intervals short: results were written in them, and aborted
    written = await read_all(eos_bootstrap, env["SENSORS_ALERTS"])
    print(f"alerts: {len(alerts)} committed, {len(written)} written; kills of a processor stopped inside an "
          f"open transaction that then aborted: {frozen_in_open_transaction} (rounds re-drawn: {redrawn})")
    assert frozen_in_open_transaction >= 1
    assert len(written) > len(alerts)


OpenSpans = dict[TopicPartition, tuple[int, int]]  # per partition, offsets [first, end) in an open transaction


async def aborted_among(bootstrap: str, spans: OpenSpans) -> int:
    """Waits until the records in ``spans`` are decided (each partition's last stable offset at or past the
    span's end), then answers how many of them a read_committed reader does not get: aborted."""
    seen: dict[str, set[tuple[int, int]]] = {}
    for isolation_level in ("read_committed", "read_uncommitted"):
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                    isolation_level=isolation_level)
        await consumer.start()
        try:
            tps = list(spans)
            consumer.assign(tps)
            deadline = time.monotonic() + 120  # the next instance's start fences the killed one and aborts
            while isolation_level == "read_committed" and any(
                    stable < spans[tp][1] for tp, stable in (await consumer.end_offsets(tps)).items()):
                assert time.monotonic() < deadline, ("the open transaction was never decided", spans)
                await asyncio.sleep(0.1)
            for tp, (first, _) in spans.items():
                consumer.seek(tp, first)
            offsets = seen.setdefault(isolation_level, set())
            while any([await consumer.position(tp) < spans[tp][1] for tp in tps]):
                for tp, messages in (await consumer.getmany(timeout_ms=500)).items():
                    offsets.update((tp.partition, m.offset) for m in messages if m.offset < spans[tp][1])
        finally:
            await consumer.stop()
    return len(seen["read_uncommitted"] - seen["read_committed"])


async def produce_in_slices(bootstrap: str, topic: str, rows: list[dict[str, Any]], size: int = 100) -> None:
    """``rows`` a slice at a time: the processor keeps writing new results for a while."""
    for i in range(0, len(rows), size):
        await produce(bootstrap, topic, rows[i : i + size])


def batch_jump_alerts(readings: list[dict[str, Any]], ratio: float = 1.1) -> list[tuple[str, int, float]]:
    """What ``JumpAlert`` emits, computed over the whole input at once."""
    previous: dict[str, float] = {}
    out = []
    for r in readings:
        last = previous.get(r["sensor"])
        if last is not None and last > 0 and r["temp"] > ratio * last:
            out.append((r["sensor"], r["ts"], r["temp"]))
        previous[r["sensor"]] = r["temp"]
    return sorted(out)


def test_an_unknown_guarantee_is_refused_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    from sluice.cli_process import run_process

    assert run_process("processors.examples.sensors:pipeline", "127.0.0.1:9", 1.0, guarantee="twice") == 2
    assert "--guarantee must be one of at-least-once, exactly-once" in capsys.readouterr().err


async def test_a_rebalance_commits_the_revoked_partitions_interval_and_the_new_owner_restores_it(
        sluice: SluiceProcess, tmp_path: Path) -> None:
    """A runs alone over half the data (windows half full, inside an open transaction); B joins: A's
    revoke checkpoint commits that transaction, B restores the revoked partitions' state read_committed
    and finishes their windows. Two instances on one host: two instance ids.

    The end waits for every window read_committed: results seen read_uncommitted may belong to an
    interval that is aborted later (a member that finds itself out of the group drops and recomputes
    them), and stopping both then left them uncomputed (8 windows of one partition missing, under load).
    So A stops first (its final checkpoint commits, B takes over its partitions) and B checkpoints every
    0.5 s once it owns partitions; A commits only at rebalances and stops, as the checks above need."""
    readings = sensor_readings(60)
    expected = batch_window_means(readings, 10_000)
    env = topics("eos-join")
    half = len(readings) // 2 + 55  # mid-window for every sensor
    await produce(sluice.bootstrap, env["SENSORS_INPUT"], readings[:half])
    await heartbeat_all(sluice.bootstrap, env["SENSORS_INPUT"], readings[half - 1]["ts"] - 6_000)
    # sessions a loaded host's pauses do not outlast (a member out of the group recomputes its interval)
    options = ("--guarantee", "exactly-once", "--session-timeout-ms", "6000")
    a = Processor(sluice.bootstrap, env, tmp_path / "a.log", *options, "--checkpoint-interval", "600",  # see above
                  "--instance-id", "a")
    b = None
    try:
        deadline = time.monotonic() + 60
        while len(finals(await read_all(sluice.bootstrap, env["SENSORS_OUTPUT"]))) < 20:  # written, uncommitted
            assert time.monotonic() < deadline, a.log.read_text()[-3000:]
            await asyncio.sleep(0.2)
        assert await read_all(sluice.bootstrap, env["SENSORS_OUTPUT"], "read_committed") == []
        b = Processor(sluice.bootstrap, env, tmp_path / "b.log", *options, "--checkpoint-interval", "0.5",
                      "--instance-id", "b")
        while not (b.assigned() and b.assigned()[-1] and len(a.assigned()) >= 2):
            assert time.monotonic() < deadline, (a.log.read_text()[-2000:], b.log.read_text()[-2000:])
            await asyncio.sleep(0.1)
        # the revoke committed A's interval: its results are visible read_committed now
        assert len(finals(await read_all(sluice.bootstrap, env["SENSORS_OUTPUT"], "read_committed"))) >= 20
        assert any(r != "{}" for r in b.restored()), b.log.read_text()[-3000:]
        await produce(sluice.bootstrap, env["SENSORS_INPUT"], readings[half:])
        await heartbeat_all(sluice.bootstrap, env["SENSORS_INPUT"], readings[-1]["ts"] + 60_000)
        await wait_for_windows(sluice.bootstrap, env["SENSORS_OUTPUT"], len(expected))  # written, maybe uncommitted
        assert a.stop() == 0, a.log.read_text()[-3000:]  # commits its last interval; B restores its partitions
        await wait_for_windows(sluice.bootstrap, env["SENSORS_OUTPUT"], len(expected), isolation_level="read_committed")
    finally:
        for p in (a, b):  # a clean stop commits each one's last interval
            if p is not None:
                assert p.stop() == 0, p.log.read_text()[-3000:]
    rows = await read_all(sluice.bootstrap, env["SENSORS_OUTPUT"], "read_committed")
    logs = (a.log.read_text()[-4000:], b.log.read_text()[-4000:] if b else "", sluice.log_text()[-3000:])
    assert Counter(tuple(r["_key"]) for r in rows).most_common(1)[0][1] == 1, logs
    assert finals(rows) == {k: pytest.approx(v) for k, v in expected.items()}, logs
