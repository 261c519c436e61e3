"""``python -m bench.fuzz.file_restarts --rounds R --seed S``: a tailed file with garbage and truncated lines,
and ``kill -9`` of ``sluice serve`` while it reads: the file source's resume (``ingest/file/``: positions,
the append journal) under hostile input.

Two file sources tail their files (NDJSON and CSV, ``read_bytes`` 1000 and ``max_line_bytes`` 4096, so that
a read ends inside lines and overlong lines span reads). Each round appends, in random pieces (a line cut
across appends, a partial last line left waiting for its newline across the kill), valid lines that each
carry a unique marker mixed with hostile ones (the TCP campaign's: invalid UTF-8, NULs, lines past the
limit, bad quotes, CR mixes), then kills the broker with SIGKILL at a random moment and starts it again on
the same data directory. After the last round every line is completed and the sources are given time to
catch up.

Checks: every restart comes up; every valid line is read back from its topic exactly once, byte for byte
(confluent-kafka, from the beginning); the broker log holds no ERROR/CRITICAL record or traceback. Exit
code 1 on a finding.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.fuzz.harness import BrokerProcess, restart_on_same_data
from bench.fuzz.tcp import hostile_line

__all__ = ["main"]

MAX_LINE = 4096
CSV_HEADER = b"device,marker,temp\n"


def _valid(fmt: str, marker: str, rng: random.Random) -> bytes:
    device = rng.choice(("d1", "d2", "pump-7", "d\u00e9"))
    if fmt == "ndjson":
        return json.dumps({"device": device, "marker": marker, "temp": round(rng.uniform(-40, 60), 2)}).encode()
    return f"{device},{marker},{rng.uniform(-40, 60):.2f}".encode()


def _content(fmt: str, rng: random.Random, round_: int, expected: Counter[bytes]) -> bytes:
    parts = []
    for i in range(rng.choice((10, 200, 1000, 3000))):
        if rng.random() < 0.3:
            bad = hostile_line(rng, fmt).replace(b"\n", b" ")
            if len(bad) > MAX_LINE and rng.random() < 0.5:
                bad = bad[: rng.choice((MAX_LINE - 1, MAX_LINE, MAX_LINE + 1, 3 * MAX_LINE))]
            parts.append(bad + rng.choice((b"\n", b"\r\n", b"\r\r\n")))
            continue
        line = _valid(fmt, f"{fmt}-r{round_}-l{i}", rng)
        expected[line] += 1
        parts.append(line + rng.choice((b"\n", b"\n", b"\r\n")))
    return b"".join(parts)


def _append_in_pieces(path: Path, data: bytes, rng: random.Random) -> None:
    pos = 0
    with path.open("ab") as f:
        while pos < len(data):
            step = rng.choice((1, 7, 300, 1000, 5000, 20_000))
            f.write(data[pos : pos + step])
            f.flush()
            pos += step
            if rng.random() < 0.1:
                time.sleep(rng.choice((0.001, 0.02)))


def _read_back(broker: BrokerProcess, topics: list[str], expected: Counter[bytes], wait: float) -> Counter[bytes]:
    """The values of ``topics``, read until every expected line is there or ``wait`` seconds have passed."""
    from confluent_kafka import Consumer, TopicPartition

    host, port = broker.endpoints["kafka"]
    consumer = Consumer({"bootstrap.servers": f"{host}:{port}", "group.id": "file-check", "enable.auto.commit": False})
    stored: Counter[bytes] = Counter()
    try:
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            metadata = consumer.list_topics(timeout=30)
            parts = [TopicPartition(t, p, 0) for t in topics if t in metadata.topics
                     for p in metadata.topics[t].partitions]
            stored.clear()
            consumer.assign(parts)
            ends = {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in parts}
            remaining = {k for k, v in ends.items() if v > 0}
            while remaining and time.monotonic() < deadline:
                for message in consumer.consume(1000, 1.0):
                    if message.error():
                        continue
                    stored[message.value()] += 1
                    if message.offset() + 1 >= ends[(message.topic(), message.partition())]:
                        remaining.discard((message.topic(), message.partition()))
            if all(stored[line] >= n for line, n in expected.items()):
                break
            time.sleep(1)
    finally:
        consumer.close()
    return stored


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz.file_restarts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="work directory (broker log, data, the files)")
    args = parser.parse_args(argv)
    work = args.out or Path(tempfile.mkdtemp(prefix="sluice-fuzz-files-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    paths = {"ndjson": work / "in.ndjson", "csv": work / "in.csv"}
    paths["ndjson"].write_bytes(b"")
    paths["csv"].write_bytes(CSV_HEADER)
    files = [{"name": f"fz-{fmt}", "path": str(path), "format": fmt, "mode": "tail", "topic": f"file-{fmt}",
              "poll_interval_s": 0.05, "read_bytes": 1000, "max_line_bytes": MAX_LINE}
             for fmt, path in paths.items()]
    extra = {"SLUICE_MQTT__ENABLED": "false", "SLUICE_INGEST__FILES": json.dumps(files)}
    broker = BrokerProcess(extra, work)
    broker.start()
    env = {**os.environ, "SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__PORT": "0", "SLUICE_TCP__PORT": "0",
           "SLUICE_HTTP__PORT": "0", **extra}
    expected: Counter[bytes] = Counter()
    failures: list[str] = []
    carried = {fmt: b"" for fmt in paths}  # a line cut at the kill: its rest is appended after the restart
    try:
        for round_ in range(args.rounds):
            # the kill comes while the files grow (the sources reading behind), or a moment after
            kill_fmt, kill_share = rng.choice(list(paths)), rng.choice((0.1, 0.5, 0.9, 1.0))
            seconds = -1.0
            for fmt, path in paths.items():
                data = carried[fmt] + _content(fmt, rng, round_, expected)
                cut = len(data) - rng.randrange(0, 40) if rng.random() < 0.5 else len(data)
                if fmt == kill_fmt and kill_share < 1.0:
                    middle = int(cut * kill_share)
                    _append_in_pieces(path, data[:middle], rng)
                    time.sleep(rng.choice((0.0, 0.01, 0.1)))
                    seconds = restart_on_same_data(broker, env, round_, {"http", "kafka"})
                    _append_in_pieces(path, data[middle:cut], rng)
                else:
                    _append_in_pieces(path, data[:cut], rng)
                carried[fmt] = data[cut:]
            if seconds < 0:
                time.sleep(rng.choice((0.0, 0.01, 0.1, 0.5)))
                seconds = restart_on_same_data(broker, env, round_, {"http", "kafka"})
            print(f"round {round_}: restarted in {seconds:.1f} s", flush=True)
        for fmt, path in paths.items():
            _append_in_pieces(path, carried[fmt], rng)
        stored = _read_back(broker, [f"file-{fmt}" for fmt in paths], expected, wait=120)
        missing = [line for line in expected if stored[line] < expected[line]]
        twice = [line for line in expected if stored[line] > expected[line]]
        if missing:
            failures.append(f"{len(missing)} valid lines not read back, e.g. {missing[0][:120]!r}")
        if twice:
            failures.append(f"{len(twice)} valid lines stored more than once, e.g. {twice[0][:120]!r}")
        failures += [f"broker log: {r[:1500]}" for r in broker.new_log_findings(final=True)]
    except RuntimeError as exc:
        failures.append(str(exc))
    finally:
        broker.stop()
    for failure in failures[:20]:
        print(failure, flush=True)
    print(f"{args.rounds} rounds, {sum(expected.values())} valid lines among the garbage, seed {args.seed}: "
          f"{len(failures)} findings; broker log {broker.log_path}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
