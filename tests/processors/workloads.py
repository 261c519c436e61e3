"""The lectures' workloads, generated deterministically from a seed."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

__all__ = ["batch_window_means", "key_values", "sensor_readings", "shuffle_by"]

T0 = 1_700_000_000_000  # event time origin (ms), a multiple of 10 s


def sensor_readings(seconds: float, *, sensors: int = 10, seed: int = 1, t0: int = T0) -> list[dict[str, Any]]:
    """10 sensors ``sensor_<n>``; temperature starts at 65 + N(0,1)·20 °F and moves by N(0,1)·5
    every 100 ms. Returned sorted by event time."""
    rng = random.Random(seed)
    temps = [65 + rng.gauss(0, 1) * 20 for _ in range(sensors)]
    out = []
    for step in range(int(seconds * 10)):
        ts = t0 + step * 100
        for n in range(sensors):
            temps[n] += rng.gauss(0, 1) * 5
            out.append({"sensor": f"sensor_{n}", "temp": round(temps[n], 3), "ts": ts})
    return out


def shuffle_by(records: list[dict[str, Any]], max_delay_ms: int, *, seed: int = 2) -> list[dict[str, Any]]:
    """Arrival order with each record delayed by up to ``max_delay_ms`` (late data)."""
    rng = random.Random(seed)
    keyed = [(r["ts"] + rng.uniform(0, max_delay_ms), i, r) for i, r in enumerate(records)]
    return [r for _, _, r in sorted(keyed)]


def key_values(count: int, *, seed: int = 3, t0: int = T0) -> list[dict[str, Any]]:
    """Lines "key,value": key a–z, value 0–25, one every 10 ms."""
    rng = random.Random(seed)
    return [{"key": chr(97 + rng.randrange(26)), "value": rng.randrange(26), "ts": t0 + i * 10} for i in range(count)]


def batch_window_means(records: list[dict[str, Any]], size_ms: int) -> dict[tuple[int, int, str], float]:
    """The same tumbling-window mean computed as a batch job: ``{(start, end, sensor): mean}``."""
    sums: dict[tuple[int, int, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for r in records:
        start = r["ts"] - r["ts"] % size_ms
        acc = sums[(start, start + size_ms, r["sensor"])]
        acc[0] += r["temp"]
        acc[1] += 1
    return {k: s / n for k, (s, n) in sums.items()}
