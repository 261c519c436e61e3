"""The ingest health registry's per-write bookkeeping (``HealthRegistry.record_batch``), alone.

    python -m bench.bench_health [--rounds 4]        # 4 x 50 writes; --rounds 0 runs the setup alone

Each write is shaped like one socket read of ``bench.bench_tcp``: 870 lines from 1,000 devices (about 580
distinct devices per write), the clock advancing 10 ms per write. Wall time on a shared machine is noisy, so
the figure in RESULTS.md is counted in instructions under callgrind (``valgrind --tool=callgrind python -m
bench.bench_health``), --rounds 4 minus --rounds 0, divided by the messages recorded.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import Counter

from ingest.health import HealthRegistry
from ingest.routing import SourceRef

WRITES, LINES, DEVICES = 50, 870, 1_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="times the 50 writes are recorded (0: setup only)")
    rounds = parser.parse_args().rounds
    rng = random.Random(1)
    now = [1_700_000_000.0]
    registry = HealthRegistry(clock=lambda: now[0])
    source = SourceRef("tcp", "default")
    writes: list[dict[str | None, list[int]]] = []
    for _ in range(WRITES):
        counts = Counter(f"dev-{rng.randrange(DEVICES):04d}" for _ in range(LINES))
        writes.append({device: [n, 75 * n] for device, n in counts.items()})
    started = time.perf_counter()
    for _ in range(rounds):
        for per_device in writes:
            now[0] += 0.01
            registry.record_batch(source, per_device)
    messages = rounds * WRITES * LINES
    if messages:
        print(f"{messages} messages, {(time.perf_counter() - started) / messages * 1e9:.0f} ns per message")


if __name__ == "__main__":
    main()
