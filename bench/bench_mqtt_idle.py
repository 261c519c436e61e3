"""What an idle MQTT connection costs Sluice, and which part of it is whose.

    python -m bench.bench_mqtt_idle [--connections 10000] [--trace 5000]

1. RSS: a fresh ``sluice serve`` process per event loop (``SLUICE_EVENT_LOOP=uvloop`` and ``asyncio``),
   ``--connections`` MQTT 3.1.1 connections from a separate process (CONNECT, CONNACK, then idle, keep
   alive 600 s): the RSS delta per connection, and Mosquitto's the same way (as ``bench_mqtt``).
2. tracemalloc: the MQTT listener in this process (each loop in turn), ``--trace`` idle connections; the
   Python-heap bytes allocated per connection, grouped by the line that allocated them (uvloop allocates
   its transports and libuv handles through Python's allocator, so they show up under uvloop's own
   module), and the same total measured by RSS in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench.bench_mqtt import mosquitto_memory, open_idle, raise_fd_limit, rss_kib, sluice_memory
from broker.log.memory import MemoryLogStore
from ingest.mqtt.listener import MqttListener
from sluice.components.mqtt import mqtt_listener
from sluice.config import load_settings
from sluice.runtime import Runtime


async def traced(count: int, data_dir: Path) -> tuple[int, int, list[tuple[str, int]]]:
    """(traced bytes, RSS bytes, [(where, bytes)]) that ``count`` idle connections added in this process."""
    data_dir.mkdir(parents=True, exist_ok=True)
    store = MemoryLogStore()
    await store.start()
    runtime = Runtime(load_settings(None, data_dir=data_dir, mqtt={"port": 0}), store)
    listener = mqtt_listener(runtime)
    assert isinstance(listener, MqttListener)
    await listener.start()
    try:
        gc.collect()
        before = tracemalloc.take_snapshot()
        rss_before = rss_kib()
        child = await asyncio.to_thread(open_idle, listener.port, count)
        deadline = time.monotonic() + 30
        while len(listener.hub.connections) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        gc.collect()
        after = tracemalloc.take_snapshot()
        rss_after = rss_kib()
        stats = after.compare_to(before, "lineno")
        total = sum(s.size_diff for s in stats)
        top = [(str(s.traceback), s.size_diff) for s in stats[:25] if s.size_diff > count * 4]
        assert child.stdin is not None
        child.stdin.close()
        await asyncio.to_thread(child.wait)
        return total, (rss_after - rss_before) * 1024, top
    finally:
        await listener.stop()
        await store.close()


def run_loop(loop: str, main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main())
    return asyncio.run(main())


def main(args: argparse.Namespace) -> None:
    raise_fd_limit()
    tmp = Path(tempfile.mkdtemp(prefix="bench-mqtt-idle-"))
    try:
        n = args.connections
        if n:
            for loop in ("uvloop", "asyncio"):
                before, after = sluice_memory(n, tmp / f"serve-{loop}", loop)
                print(f"sluice serve ({loop}): {n} idle connections, RSS {before / 1024:.1f} -> {after / 1024:.1f} MiB"
                      f" = {(after - before) * 1024 / n / 1024:.2f} KiB/connection", flush=True)
            (tmp / "mosq").mkdir()
            mb, ma = mosquitto_memory(n, tmp / "mosq")
            print(f"mosquitto: {n} idle connections, RSS {mb / 1024:.1f} -> {ma / 1024:.1f} MiB"
                  f" = {(ma - mb) * 1024 / n / 1024:.2f} KiB/connection", flush=True)
        t = args.trace
        if t:
            tracemalloc.start(1)
            for loop in ("uvloop", "asyncio"):
                total, rss, top = run_loop(loop, lambda: traced(t, tmp / f"traced-{loop}"))  # noqa: B023
                print(f"in process ({loop}), {t} connections: Python heap +{total / t:,.0f} B/connection"
                      f" (RSS +{rss / t:,.0f} B/connection, tracemalloc's own bookkeeping included); by line:")
                for where, size in top:
                    print(f"  {size / t:8,.0f} B  {where}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=10_000, help="RSS: idle connections (0: skip)")
    parser.add_argument("--trace", type=int, default=5_000, help="tracemalloc: idle connections (0: skip)")
    main(parser.parse_args())
