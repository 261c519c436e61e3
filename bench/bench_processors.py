"""Stream processors vs Bytewax: records/s for a keyed tumbling-window mean over 1M records.

Run: ``python -m bench.bench_processors [--records N] [--repeat R]``. One run, side by side, the same input:
N JSON readings ``{"sensor", "temp", "ts"}`` from 100 sensors (keyed by sensor, 1 ms apart in
event time), a 10 s tumbling-window mean per sensor with 5 s out-of-orderness.

* Sluice attached: the records sit in an in-process ``MemoryLogStore`` (4 partitions, 2 000-record
  batches); ``AttachedRunner`` reads them from the log, decodes, windows, writes results back.
* Sluice standalone: ``sluice serve`` (memory storage) in a subprocess; the records are produced
  beforehand with confluent-kafka; ``run_standalone`` consumes them as a group member (aiokafka),
  windows, produces results and checkpoints over the Kafka protocol.
* Sluice standalone exactly-once: the same with ``guarantee="exactly-once"`` (results, checkpoints
  and offsets in one Kafka transaction per checkpoint interval), read back ``read_committed``. Both
  standalone rows are timed to the end of their final checkpoint.
* Sluice standalone, key_by repartitioned: the at-least-once row with ``key_by(repartition=True)``:
  the records go through ``<group>.repartition.0`` (upstream stage: decode, key, write; downstream
  stage: read, window), as a pipeline keyed other than its input would (the shuffle's cost).
  ``--shuffle-only`` runs this row and the standalone at-least-once row alone (quick iterations).
* Quix Streams (PyPI, ``bench.quix_mean_app``): the same mean as a Quix app (tumbling window with 5 s
  grace, RocksDB state, changelog topics, at-least-once) in a subprocess, over the topic the standalone
  rows read on the same ``sluice serve``; timed by itself from its start to its last record.
* Sluice attached at-least-once vs exactly-once, 1 s checkpoints, timed to the end of the final
  checkpoint: the cost of a transaction per interval (``processors.attached_txn``).
* Bytewax (PyPI): ``TestingSource`` over the same (key, value bytes) pairs, ``json.loads``,
  ``EventClock`` + ``TumblingWindower`` + ``fold_window``.
* Plain Python, compute only: one dict pass (``json.loads``, a dict of [sum, count] per window and
  sensor) over the (key, value bytes, ts) tuples already in memory; nothing read from a log, nothing
  written (a batch job; a floor for per-record overhead). The target "attached >= 1x the plain-Python
  batch loop" is measured against this row: the attached runner reads and decodes stored batches and
  writes its results, this loop does neither.
* Plain Python, end to end: the same loop doing what the attached runner does besides computing: it
  reads the same stored batches from a ``MemoryLogStore`` (4 partitions, 2 000-record batches) and
  decodes them with the decoder the attached runner uses (aiokafka's C record parser), and appends its
  results to an output topic as JSON records keyed by window, as the attached runner does.
* Sluice executor, compute only: ``Executor.process`` (decode JSON, event time, key, window, encode
  results) over records already decoded from the log and kept in memory, 4 000 per call, outputs
  taken but not written: the counterpart of the compute-only plain row.

Input preparation is not timed. Every engine's results are checked against the batch job. The
engines run in R interleaved rounds (attached, standalone, Bytewax, plain, attached, ...) so noise
from a shared machine hits all of them; best and median rates are printed, and each ratio line also
gives the ratios within each round ("paired": min-max and median, and each round's), and the same by
CPU time (records per CPU second over the timed span: this process's CPU, plus ``sluice serve``'s
for the standalone rows; the Quix row has none): a row's wall time on a shared machine depends on
the share of the cores it got, its CPU time is what it cost. Each round starts with its load average.
Each exactly-once row runs right beside its at-least-once pair, first in odd rounds and second in even
ones. The process runs as Sluice's own processes do (``sluice serve`` hosts the attached runners, ``sluice process`` the
standalone ones): on uvloop, and with the serving garbage-collector settings (``sluice.gc_tuning``:
what exists once the input is prepared is frozen out of the collector's reach, generation 0 collects
every 20,000 allocations). Every in-process engine (Bytewax and the plain loops too) runs under them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from broker.log.memory import MemoryLogStore
from broker.log.partitioner import partition_for_key
from broker.protocol.records import RecordSpec, encode_batch
from processors.aggregations import Mean
from processors.hosting import AttachedRunner, run_standalone
from processors.pipeline import Pipeline
from processors.runner import AT_LEAST_ONCE, EXACTLY_ONCE, Guarantee, Runner, RunnerConfig
from processors.watermarks import BoundedOutOfOrderness
from processors.windows import Tumbling
from sluice.cli_process import run_event_loop
from sluice.gc_tuning import tune_for_serving

T0 = 1_700_000_000_000
SENSORS = 100
PARTITIONS = 4
WINDOW_MS = 10_000

Row = tuple[bytes, bytes, int]  # key, value, event time


class Timer:
    """A row's wall time, and the CPU time spent over the same span: this process's (the in-process
    engines, and the standalone processor), plus the ``sluice serve`` subprocess's for the rows that
    use it (``broker_pid``). On this shared machine the wall time of a row depends on the share of the
    cores it got; the CPU time is what the row cost, and varies far less from round to round."""

    broker_pid: int | None = None

    def __init__(self) -> None:
        self.t0 = self.c0 = 0.0
        self.cpu: float | None = None
        self.with_broker = False

    def start(self, *, with_broker: bool = False) -> float:
        self.with_broker = with_broker
        self.c0 = self._cpu()
        self.t0 = time.perf_counter()
        return self.t0

    def elapsed(self) -> float:
        """Wall seconds since ``start``; ``cpu`` gets the CPU seconds."""
        wall = time.perf_counter() - self.t0
        self.cpu = self._cpu() - self.c0
        return wall

    def _cpu(self) -> float:
        own = time.process_time()
        if not self.with_broker or self.broker_pid is None:
            return own
        fields = Path(f"/proc/{self.broker_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return own + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


TIMER = Timer()


def make_input(n: int) -> list[Row]:
    rng = random.Random(1)
    temps = [65 + rng.gauss(0, 1) * 20 for _ in range(SENSORS)]
    rows = []
    for i in range(n):
        s = i % SENSORS
        temps[s] += rng.gauss(0, 1) * 5
        ts = T0 + i
        rows.append((f"sensor_{s}".encode(), json.dumps({"sensor": f"sensor_{s}", "temp": round(temps[s], 3),
                                                          "ts": ts}).encode(), ts))
    return rows


def batch_job(rows: list[Row]) -> dict[tuple[int, str], float]:
    acc: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for _key, value, _ts in rows:
        v = json.loads(value)
        a = acc[(v["ts"] - v["ts"] % WINDOW_MS, v["sensor"])]
        a[0] += v["temp"]
        a[1] += 1
    return {k: s / c for k, (s, c) in acc.items()}


def closed(expected: dict[tuple[int, str], float], rows: list[Row]) -> dict[tuple[int, str], float]:
    """Windows a watermark of (max ts − 5 s) has closed (the still-open last one is excluded)."""
    watermark = rows[-1][2] - 5_000 - 1
    return {k: v for k, v in expected.items() if k[0] + WINDOW_MS - 1 <= watermark}


def check(name: str, got: dict[tuple[int, str], float], want: dict[tuple[int, str], float]) -> str:
    bad = [k for k, v in want.items() if k not in got or abs(got[k] - v) > 1e-6 * max(1.0, abs(v))]
    return "ok" if not bad and len(got) >= len(want) else f"MISMATCH ({len(bad)} of {len(want)} windows wrong)"


def pipeline(topic: str, group: str, out: str, *, repartition: bool = False) -> Pipeline:
    """The input is keyed by sensor: no repartition topic is needed unless ``repartition`` forces one."""
    stream = Pipeline.source(topic, group=group, event_time=lambda v: v["ts"],
                             watermarks=BoundedOutOfOrderness(5_000, idle_timeout=None))
    (stream.key_by(lambda v: v["sensor"], repartition=repartition)
        .window(Tumbling(WINDOW_MS)).aggregate(Mean("temp")).sink(out))
    return stream.pipeline


def results_from(values: list[bytes]) -> dict[tuple[int, str], float]:
    out = {}
    for raw in values:
        r = json.loads(raw)
        out[(r["window_start"], r["key"])] = r["value"]
    return out


# ------------------------------------------------------------------------------------- engines


async def run_attached(rows: list[Row], guarantee: Guarantee | None = None
                       ) -> tuple[float, dict[tuple[int, str], float]]:
    """``guarantee`` None: the classic row (10 s checkpoints, timed to the last record processed). Given:
    1 s checkpoints (each exactly-once interval a transaction of the broker's coordinator), timed to the
    end of the final checkpoint (stop), so that both guarantees pay for what they write."""
    store = stored_input(rows)
    transactions = None
    if guarantee == EXACTLY_ONCE:
        from broker.txn.coordinator import TransactionCoordinator

        ids = iter(range(1, 1 << 30))

        async def no_group_offsets(group: str, offsets: Any) -> None:
            return None

        transactions = TransactionCoordinator(store, lambda: next(ids), no_group_offsets)
        await transactions.start()
    config = RunnerConfig(max_batch_records=4_000, checkpoint_interval_ms=10_000 if guarantee is None else 1_000,
                          guarantee=guarantee or AT_LEAST_ONCE)
    runner = AttachedRunner(pipeline("bench-in", "bench-attached", "bench-out"), store, config=config,
                            transactions=transactions)
    TIMER.start()
    await runner.start()
    while runner.executor.records_in < len(rows) or runner.out_q.qsize() or runner.in_q.qsize():
        await asyncio.sleep(0.005)
    elapsed = TIMER.elapsed()
    await runner.stop()
    if guarantee is not None:
        elapsed = TIMER.elapsed()
    if transactions is not None:
        await transactions.stop()
    from broker.protocol.records import decode_all

    values = [r.value for log in store.partitions("bench-out") for r in decode_all(log.read(0, 1 << 30)) if r.value]
    return elapsed, results_from(values)


def start_sluice(data_dir: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = {**os.environ, "SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__ENABLED": "false", "SLUICE_TCP__ENABLED": "false",
           "SLUICE_HTTP__ENABLED": "false", "SLUICE_STORAGE__BACKEND": "memory",
           "SLUICE_STORAGE__DEFAULT_PARTITIONS": str(PARTITIONS),
           # Kafka's group.initial.rebalance.delay.ms (3 s by default, as in Kafka) is a one-time wait
           # before a new group's first assignment, not processing time: 0 here, as Kafka's docs
           # suggest for tests, so the standalone row times the pipeline and not the join delay.
           "SLUICE_KAFKA__GROUP_INITIAL_REBALANCE_DELAY_MS": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(data_dir)], env=env,
                            stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    endpoints = data_dir / "endpoints.json"
    deadline = time.monotonic() + 30
    while not (endpoints.exists() and "kafka" in endpoints.read_text()):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("sluice serve did not start")
        time.sleep(0.05)
    port = json.loads(endpoints.read_text())["kafka"]["port"]
    return proc, f"127.0.0.1:{port}"


def produce_confluent(bootstrap: str, topic: str, rows: list[Row]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000,
                         "queue.buffering.max.messages": 2_000_000, "acks": "all"})
    for key, value, ts in rows:
        while True:
            try:
                producer.produce(topic, value, key, timestamp=ts)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


async def read_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    # read_committed: the exactly-once row's results count only once committed
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                isolation_level="read_committed")
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[bytes] = []
        while True:
            positions = [await consumer.position(tp) for tp in tps]
            if all(pos >= ends[tp] for pos, tp in zip(positions, tps, strict=True)):
                return out
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                out += [m.value for m in messages if m.value]
    finally:
        await consumer.stop()


async def run_standalone_bench(rows: list[Row], bootstrap: str, round_: int, guarantee: Guarantee = AT_LEAST_ONCE,
                               *, repartition: bool = False) -> tuple[float, dict[tuple[int, str], float]]:
    """A fresh consumer group (and output topic) per round, reading the same produced input. The time
    runs to the end of the final checkpoint (stop): exactly-once results count once committed. With
    ``repartition`` the key_by goes through a repartition topic (two stages, two groups)."""
    stop = asyncio.Event()
    tag = ("eos" if guarantee == EXACTLY_ONCE else "alo") + ("-shuffle" if repartition else "")
    out_topic = f"bench-sa-out-{tag}-{round_}"
    p = pipeline("bench-sa-in", f"bench-standalone-{tag}-{round_}", out_topic, repartition=repartition)
    started: list[Runner] = []
    TIMER.start(with_broker=True)  # group join and partition assignment are included in the time
    task = asyncio.create_task(run_standalone(p, bootstrap, stop=stop, on_started=started.append, instance_id="bench",
                                              config=RunnerConfig(guarantee=guarantee, max_batch_records=4_000)))
    while not started:
        if task.done():
            raise RuntimeError(f"standalone runner ended early: {task.exception()!r}")
        await asyncio.sleep(0.01)
    first, last = started[0], started[-1]  # the keyed stage is the last (the only one without a repartition)
    # repartitioned, the last windows close when the upstream's final watermark has crossed the shuffle: its
    # mark may follow the last record by up to a tick (stopping before it left those windows unwritten)
    while (last.executor.records_in < len(rows) or last.executor.watermark < first.executor.watermark
           or any(r.out_q.qsize() or r.in_q.qsize() for r in started)):
        if task.done():
            raise RuntimeError(f"standalone runner ended early: {task.exception()!r}")
        await asyncio.sleep(0.005)
    stop.set()
    await task
    elapsed = TIMER.elapsed()
    return elapsed, results_from(await read_topic(bootstrap, out_topic))


def run_quix(rows: list[Row], bootstrap: str, round_: int, tmp: Path) -> tuple[float, dict[tuple[int, str], float]]:
    """Quix Streams (``bench.quix_mean_app``) in a subprocess over the topic the standalone rows read;
    its own timer, from its start (group join included) to its last record processed."""
    out_topic = f"bench-quix-out-{round_}"
    proc = subprocess.run([sys.executable, "-m", "bench.quix_mean_app", bootstrap, "bench-sa-in", out_topic,
                           f"bench-quix-{round_}", str(tmp / f"quix-state-{round_}"), str(len(rows))],
                          capture_output=True, text=True, timeout=1_800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the Quix app failed ({proc.returncode}): {proc.stderr[-3000:]}")
    elapsed = float(proc.stdout.strip().splitlines()[-1])
    TIMER.cpu = None  # its own timer, in its own process
    from confluent_kafka.admin import AdminClient

    # Quix creates its output topic with its own partition count
    partitions = len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(out_topic, timeout=10)
                     .topics[out_topic].partitions)
    return elapsed, results_from(asyncio.run(read_topic(bootstrap, out_topic, partitions)))


def run_bytewax(rows: list[Row]) -> tuple[float, dict[tuple[int, str], float]]:
    import bytewax.operators as op
    import bytewax.operators.windowing as win
    from bytewax.dataflow import Dataflow
    from bytewax.testing import TestingSink, TestingSource, run_main

    out: list[Any] = []
    flow = Dataflow("bench")
    inp = op.input("in", flow, TestingSource([(k, v) for k, v, _ in rows], batch_size=2_000))
    values = op.map("parse", inp, lambda kv: json.loads(kv[1]))
    keyed = op.key_on("key", values, lambda v: v["sensor"])
    clock: win.EventClock[dict[str, Any]] = win.EventClock(lambda v: datetime.fromtimestamp(v["ts"] / 1000, tz=UTC),
                           wait_for_system_duration=timedelta(seconds=5))
    windower = win.TumblingWindower(length=timedelta(milliseconds=WINDOW_MS),
                                    align_to=datetime.fromtimestamp(0, tz=UTC))

    def folder(acc: list[float], v: dict[str, Any]) -> list[float]:
        acc[0] += v["temp"]
        acc[1] += 1
        return acc

    means = win.fold_window("mean", keyed, clock, windower, lambda: [0.0, 0], folder,
                            lambda a, b: [a[0] + b[0], a[1] + b[1]])
    op.output("out", means.down, TestingSink(out))
    TIMER.start()
    run_main(flow)
    elapsed = TIMER.elapsed()
    got = {}
    for key, (window_id, acc) in out:
        got[(window_id * WINDOW_MS, key)] = acc[0] / acc[1]
    return elapsed, got


def run_plain(rows: list[Row]) -> tuple[float, dict[tuple[int, str], float]]:
    TIMER.start()
    got = batch_job(rows)
    return TIMER.elapsed(), got


def stored_input(rows: list[Row]) -> MemoryLogStore:
    """The input as the attached rows read it: 4 key-partitioned partitions of 2 000-record batches."""
    store = MemoryLogStore()
    store.create_topic("bench-in", PARTITIONS)
    per_partition: dict[int, list[RecordSpec]] = defaultdict(list)
    for key, value, ts in rows:
        per_partition[partition_for_key(key, PARTITIONS)].append(RecordSpec(value, key, (), ts))
    for p, specs in per_partition.items():
        for i in range(0, len(specs), 2_000):
            store.partition("bench-in", p).append_nowait(encode_batch(specs[i : i + 2_000]))
    return store


async def run_plain_end_to_end(rows: list[Row]) -> tuple[float, dict[tuple[int, str], float]]:
    """The plain loop reading the stored batches (aiokafka's C parser, as the attached runner) and
    appending its results (one JSON record per window, keyed by window) to an output topic."""
    from processors.fastdecode import decode_from

    store = stored_input(rows)
    store.create_topic("bench-out", PARTITIONS)
    TIMER.start()
    acc: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for log in store.partitions("bench-in"):
        offset = log.log_start_offset
        while offset < log.high_watermark:
            records = decode_from(log.read(offset, 1 << 20), offset)
            for r in records:
                v = json.loads(r.value or b"null")
                a = acc[(v["ts"] - v["ts"] % WINDOW_MS, v["sensor"])]
                a[0] += v["temp"]
                a[1] += 1
            offset = records[-1].offset + 1
    got = {k: s / c for k, (s, c) in acc.items()}
    per_partition: dict[int, list[RecordSpec]] = defaultdict(list)
    for (window_start, sensor), mean in got.items():
        key = json.dumps([window_start, window_start + WINDOW_MS, sensor]).encode()
        value = json.dumps({"key": sensor, "window_start": window_start, "window_end": window_start + WINDOW_MS,
                            "value": mean}).encode()
        per_partition[partition_for_key(key, PARTITIONS)].append(RecordSpec(value, key, (), window_start))
    for p, specs in per_partition.items():
        await store.append_records("bench-out", specs, partition=p)
    return TIMER.elapsed(), got


def decoded_input(rows: list[Row]) -> list[tuple[tuple[str, int], list[Any]]]:
    """The stored input decoded once (before the process settings freeze it): the compute-only executor row's input."""
    from processors.fastdecode import decode_from

    store = stored_input(rows)
    out: list[tuple[tuple[str, int], list[Any]]] = []
    for log in store.partitions("bench-in"):
        records = decode_from(log.read(0, 1 << 40), 0)
        out += [(("bench-in", log.partition), records[i : i + 4_000]) for i in range(0, len(records), 4_000)]
    return out


def run_executor(decoded: list[tuple[tuple[str, int], list[Any]]], n: int
                 ) -> tuple[float, dict[tuple[int, str], float]]:
    """``Executor.process`` alone over already-decoded records, partitions in turn; outputs taken, not written."""
    from processors.executor import Executor

    executor = Executor(pipeline("bench-in", "bench-executor", "bench-out"))
    for tp in {tp for tp, _ in decoded}:
        executor.add_partition(tp, 0)
    out: list[bytes] = []
    TIMER.start()
    for tp, records in decoded:
        executor.process(tp, records, 0)
        out += [r.value for r in executor.take_outputs() if r.value]
    elapsed = TIMER.elapsed()
    assert executor.records_in == n
    return elapsed, results_from(out)


async def main_async(n: int, repeat: int, with_quix: bool = True, with_standalone: bool = True,
                     shuffle_only: bool = False) -> None:
    rows = make_input(n)
    expected = batch_job(rows)
    want_closed = closed(expected, rows)
    decoded = decoded_input(rows)
    # as sluice serve and sluice process once started: the 1M input tuples are frozen (no engine's
    # collections rescan them) and generation 0 collects every GEN0_THRESHOLD allocations
    tune_for_serving()
    names = ["sluice attached", "sluice standalone (Kafka protocol)", f"bytewax {_version('bytewax')}",
             "plain Python batch job", "sluice standalone exactly-once",
             "sluice standalone, key_by repartitioned", f"quix streams {_version('quixstreams')} (same Sluice)",
             "sluice attached, 1 s checkpoints", "sluice attached exactly-once, 1 s",
             "plain Python, end to end", "sluice executor, compute only"]
    rates: dict[str, list[float]] = {name: [] for name in names}
    cpu_rates: dict[str, list[float]] = {name: [] for name in names}  # records per CPU second
    checks: dict[str, set[str]] = {name: set() for name in names}

    Windows = dict[tuple[int, str], float]

    def record(name: str, elapsed: float, got: Windows, want: Windows) -> None:
        rates[name].append(n / elapsed)
        if TIMER.cpu:
            cpu_rates[name].append(n / TIMER.cpu)
        checks[name].add(check(name, got, want))

    with tempfile.TemporaryDirectory() as tmp:
        proc, bootstrap = start_sluice(Path(tmp)) if with_standalone else (None, "")
        Timer.broker_pid = None if proc is None else proc.pid
        try:
            if with_standalone:
                produce_confluent(bootstrap, "bench-sa-in", rows)
            # rounds interleave the engines so that noise from a shared machine hits all of them
            for round_ in range(repeat):
                print(f"round {round_ + 1} of {repeat}: load average {os.getloadavg()[0]:.1f}", flush=True)
                if shuffle_only:  # the shuffle's pair alone, for quick iterations on the repartition path
                    record(names[1], *await run_standalone_bench(rows, bootstrap, round_), want_closed)
                    record(names[5], *await run_standalone_bench(rows, bootstrap, round_, repartition=True),
                           want_closed)
                    continue
                record(names[0], *await run_attached(rows), want_closed)
                record(names[3], *run_plain(rows), expected)  # beside the attached row: the target's pair
                record(names[9], *await run_plain_end_to_end(rows), expected)
                record(names[10], *run_executor(decoded, n), want_closed)
                if not with_standalone:
                    record(names[2], *run_bytewax(rows), expected)
                    continue
                # the two guarantees back to back, so that both see the same machine, in turns first
                for name, guarantee in _in_turn(round_, [(names[1], AT_LEAST_ONCE), (names[4], EXACTLY_ONCE)]):
                    record(name, *await run_standalone_bench(rows, bootstrap, round_, guarantee), want_closed)
                # the same at-least-once pipeline with its key_by through a repartition topic (the shuffle's cost)
                record(names[5], *await run_standalone_bench(rows, bootstrap, round_, repartition=True), want_closed)
                for name, guarantee in _in_turn(round_, [(names[7], AT_LEAST_ONCE), (names[8], EXACTLY_ONCE)]):
                    record(name, *await run_attached(rows, guarantee), want_closed)
                if with_quix:
                    quix_run = await asyncio.to_thread(run_quix, rows, bootstrap, round_, Path(tmp))
                    record(names[6], *quix_run, want_closed)
                record(names[2], *run_bytewax(rows), expected)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)

    if shuffle_only:
        for name in (names[1], names[5]):
            print(f"{name:38} best {max(rates[name]):11,.0f} median {statistics.median(rates[name]):9,.0f}  "
                  f"{', '.join(sorted(checks[name]))}")
        shuffled, plain = rates[names[5]], rates[names[1]]
        print(f"repartitioned / not (standalone at-least-once): best {max(shuffled) / max(plain):.2f}, "
              f"median {statistics.median(shuffled) / statistics.median(plain):.2f}")
        return
    best_bytewax = max(rates[names[2]])
    median_bytewax = statistics.median(rates[names[2]])
    print(f"keyed 10 s tumbling mean, {n:,} records, {SENSORS} keys, Python {sys.version.split()[0]}, "
          f"{repeat} interleaved rounds")
    print(f"{'engine':38} {'best rec/s':>11} {'median':>9} {'best vs bytewax':>16} {'median vs':>10}  results")
    for name in [n for n in names if rates[n]]:
        best, median = max(rates[name]), statistics.median(rates[name])
        print(f"{name:38} {best:11,.0f} {median:9,.0f} {best / best_bytewax:15.2f}x "
              f"{median / median_bytewax:9.2f}x  {', '.join(sorted(checks[name]))}")
    print("per round (rec/s, in the order the rounds ran; then records per CPU second, the standalone rows' "
          "with the broker's CPU):")
    for name in [n for n in names if rates[n]]:
        print(f"  {name:38} " + "  ".join(f"{r:9,.0f}" for r in rates[name]) + "  | CPU "
              + "  ".join(f"{r:9,.0f}" for r in cpu_rates[name]))

    def ratio(a: str, b: str) -> str:
        # paired: the ratio within each round (the two rows ran minutes or seconds apart), then its median
        paired = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
        text = (f"best {max(rates[a]) / max(rates[b]):.2f}, "
                f"median {statistics.median(rates[a]) / statistics.median(rates[b]):.2f}, "
                f"paired {min(paired):.2f}-{max(paired):.2f} (median {statistics.median(paired):.2f}; "
                f"by round {' '.join(f'{x:.2f}' for x in paired)})")
        if len(cpu_rates[a]) == len(cpu_rates[b]) == len(paired):
            by_cpu = [x / y for x, y in zip(cpu_rates[a], cpu_rates[b], strict=True)]
            rounds = " ".join(f"{x:.2f}" for x in by_cpu)
            text += f"; by CPU time {min(by_cpu):.2f}-{max(by_cpu):.2f} (by round {rounds})"
        return text

    print(f"attached / plain Python compute only (the target's pair): {ratio(names[0], names[3])}")
    print(f"attached / plain Python end to end: {ratio(names[0], names[9])}")
    print(f"executor compute only / plain Python compute only: {ratio(names[10], names[3])}")
    if not with_standalone:
        return
    print(f"standalone / bytewax: {ratio(names[1], names[2])}")
    print(f"exactly-once / at-least-once (standalone): {ratio(names[4], names[1])}")
    print(f"exactly-once / at-least-once (attached, 1 s checkpoints): {ratio(names[8], names[7])}")
    if with_quix:
        print(f"sluice standalone / quix streams: {ratio(names[1], names[6])}")
    print(f"repartitioned / not (standalone at-least-once): {ratio(names[5], names[1])}")


def _in_turn(round_: int, pair: list[tuple[str, Guarantee]]) -> list[tuple[str, Guarantee]]:
    """A pair of rows in the order of ``pair`` in even rounds, reversed in odd ones: a machine getting
    busier or quieter within a round favours neither."""
    return pair if round_ % 2 == 0 else pair[::-1]


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds; best and median are shown")
    parser.add_argument("--no-quix", action="store_true", help="leave out the Quix Streams row")
    parser.add_argument("--attached-only", action="store_true",
                        help="only the in-process rows (attached, executor, plain, Bytewax): no broker subprocess")
    parser.add_argument("--shuffle-only", action="store_true",
                        help="only the standalone at-least-once row and its repartitioned twin (the shuffle's cost)")
    args = parser.parse_args()
    run_event_loop(main_async(args.records, args.repeat, not args.no_quix, not args.attached_only, args.shuffle_only))


if __name__ == "__main__":
    main()
