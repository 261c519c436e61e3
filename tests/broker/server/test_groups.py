"""Consumer groups with real clients in separate processes: three members share six partitions,
one is SIGKILLed, the others take its partitions over after the session timeout; every record is
consumed at least once, committed offsets never go backwards, and after a broker restart (segment
store) the group resumes from its commits."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.broker.server.conftest import SluiceProcess

PARTITIONS = 6
TOPIC = "group-test"
GROUP = "workers"
N = 30_000


def _produce(bootstrap: str, start: int, count: int, rate: float | None = None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                         "partitioner": "murmur2_random"})
    began = time.monotonic()
    for i in range(start, start + count):
        while True:
            try:
                producer.produce(TOPIC, b"v:%d" % i, b"k-%d" % (i % 50))
                break
            except BufferError:
                producer.poll(0.05)
        if rate and i % 500 == 0:
            ahead = (i - start) / rate - (time.monotonic() - began)
            if ahead > 0:
                time.sleep(ahead)
        producer.poll(0)
    assert producer.flush(30) == 0


def _member(bootstrap: str, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.broker.server.group_member", bootstrap, TOPIC, GROUP, str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _assignment(path: Path) -> set[int]:
    latest = [line for line in _lines(path) if line.startswith("assigned")]
    if not latest:
        return set()
    tail = latest[-1].removeprefix("assigned").strip()
    return {int(p) for p in tail.split(",")} if tail else set()


def _consumed(paths: list[Path]) -> list[tuple[int, int, str]]:
    out = []
    for path in paths:
        for line in _lines(path):
            if not line.startswith("assigned"):
                p, o, v = line.split(" ")
                out.append((int(p), int(o), v))
    return out


def _wait(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class CommitWatcher(threading.Thread):
    """Polls the group's committed offsets (OffsetFetch) and records every value seen."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.history: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        self.stop_event = threading.Event()

    def run(self) -> None:
        watcher = Consumer({"bootstrap.servers": self.bootstrap, "group.id": GROUP, "enable.auto.commit": False})
        try:
            while not self.stop_event.is_set():
                for tp in watcher.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=5):
                    if tp.offset >= 0:
                        self.history[tp.partition].append(tp.offset)
                self.stop_event.wait(0.2)
        finally:
            watcher.close()

    def latest(self) -> dict[int, int]:
        return {p: h[-1] for p, h in self.history.items() if h}


@pytest.mark.slow
def test_group_survives_a_killed_member_and_a_broker_restart(
    tmp_path: Path, sluice_factory: type[SluiceProcess]
) -> None:
    server = sluice_factory(tmp_path / "data", partitions=PARTITIONS)
    server.start()
    _produce(server.bootstrap, 0, 100)  # creates the topic
    outs = [tmp_path / f"member-{i}.log" for i in range(3)]
    members = [_member(server.bootstrap, out) for out in outs]
    watcher = CommitWatcher(server.bootstrap)
    try:
        _wait(lambda: sorted(len(_assignment(o)) for o in outs) == [2, 2, 2], 60,
              "three members with 2 partitions each")
        watcher.start()
        producing = threading.Thread(target=_produce, args=(server.bootstrap, 100, N - 100, 4000.0))
        producing.start()
        _wait(lambda: len(_consumed(outs[:1])) > 500, 30, "the first member to consume")
        victim_partitions = _assignment(outs[0])
        members[0].send_signal(signal.SIGKILL)
        members[0].wait()
        killed_at = time.monotonic()
        _wait(lambda: victim_partitions <= (_assignment(outs[1]) | _assignment(outs[2])), 30,
              "survivors taking over the killed member's partitions")
        takeover = time.monotonic() - killed_at
        assert _assignment(outs[1]) | _assignment(outs[2]) == set(range(PARTITIONS))
        producing.join(60)
        expected = {f"v:{i}" for i in range(N)}
        _wait(lambda: {v for _, _, v in _consumed(outs)} >= expected, 60, "every record consumed")
        _wait(lambda: sum(watcher.latest().values()) == N, 30, "final commits")
    finally:
        watcher.stop_event.set()
        for m in members:
            if m.poll() is None:
                m.send_signal(signal.SIGINT)
        for m in members:
            try:
                m.wait(timeout=20)
            except subprocess.TimeoutExpired:
                m.kill()
    watcher.join(10)
    assert takeover < 25, f"takeover took {takeover:.1f}s"
    for partition, history in watcher.history.items():
        assert history == sorted(history), f"committed offset of partition {partition} went backwards: {history}"
    committed = watcher.latest()
    assert sum(committed.values()) == N

    # Restart the broker on the same data dir; the group resumes from its commits.
    server.stop()
    server.start()
    _produce(server.bootstrap, N, 600)
    resumed = tmp_path / "resumed.log"
    member = _member(server.bootstrap, resumed)
    try:
        _wait(lambda: len(_consumed([resumed])) >= 600, 60, "the resumed member to read the new records")
    finally:
        member.send_signal(signal.SIGINT)
        try:
            member.wait(timeout=20)
        except subprocess.TimeoutExpired:  # a slow close under load is not what this test is about
            member.kill()
            member.wait()
    after = _consumed([resumed])
    assert {v for _, _, v in after} == {f"v:{i}" for i in range(N, N + 600)}  # nothing old re-read
    first: dict[int, int] = {}
    for p, o, _ in after:
        first.setdefault(p, o)
    assert first == {p: committed[p] for p in first}
