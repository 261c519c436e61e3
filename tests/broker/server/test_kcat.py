"""kcat (librdkafka's CLI, from Debian) produces and consumes 100k keyed records through Sluice."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.broker.server.conftest import SluiceProcess, check_records, values_in_key_order

N = 100_000
PARTITIONS = 4


def test_kcat_produce_and_consume(tmp_path: Path, sluice_factory: type[SluiceProcess]) -> None:
    assert shutil.which("kcat"), "kcat is installed by scripts/install-system-deps.sh"
    server = sluice_factory(tmp_path / "data", partitions=PARTITIONS)
    server.start()
    lines = "".join(f"sensor-{i % 97}\tv:{i}\n" for i in range(N))
    produce = subprocess.run(
        ["kcat", "-b", server.bootstrap, "-P", "-t", "kcat-test", "-K", "\t",
         "-X", "topic.partitioner=murmur2_random", "-X", "linger.ms=5"],
        input=lines, text=True, capture_output=True, timeout=60,
    )
    assert produce.returncode == 0, produce.stderr
    consume = subprocess.run(
        ["kcat", "-b", server.bootstrap, "-C", "-t", "kcat-test", "-o", "beginning", "-e", "-q",
         "-f", "%p\t%o\t%k\t%s\n"],
        capture_output=True, timeout=60,
    )
    assert consume.returncode == 0, consume.stderr
    received = []
    for line in consume.stdout.splitlines():
        p, o, k, v = line.split(b"\t")
        received.append((int(p), int(o), k, v))
    assert len(received) == N
    check_records(received, {f"v:{i}".encode() for i in range(N)}, PARTITIONS)
    values_in_key_order(received)
