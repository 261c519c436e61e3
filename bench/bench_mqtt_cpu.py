"""CPU per message of Sluice's MQTT ingest alone: the load of ``bench_mqtt`` without the Mosquitto runs.

    python -m bench.bench_mqtt_cpu [QOS FLUSH] [--gc serving|default] [--messages 25000]
                                   [--loadgen raw|mosquitto_pub]

4 publishers (``--loadgen``: ``bench.mqtt_loadgen`` connections from one process, the default, or
``mosquitto_pub -l -V mqttv5 -M 1000`` processes, as ``bench_mqtt``) send ``--messages`` 100-byte
messages each at QoS ``QOS``
to the MQTT listener in this process (uvloop, segment store, flush ``FLUSH``: always or os; without
them, each of QoS 0 and 1 with each flush policy). Printed: the rate,
this process's CPU time per message (user + system, from starting the publishers until every message is
durably appended), how many socket reads and appends carried them, how long the appends took
(median, 90th percentile), and the CPU the load generator used per message. CPU time is what a shared
machine's other load disturbs least, so this is the figure to compare two trees with: it runs on any
tree since 2026-11-30 (``cd <tree> && PYTHONPATH=. python -m bench.bench_mqtt_cpu 0 os``; bring this
file along for trees that lack it). ``--gc serving`` applies ``sluice serve``'s GC settings
(``sluice.gc_tuning``; an older tree run with ``PYTHONPATH=.`` from a checkout whose package is installed
in editable mode finds the module there), ``--gc default`` keeps CPython's.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_mqtt import Load, make_lines, raise_fd_limit
from sluice.config import load_settings
from sluice.runtime import Runtime
from sluice.serve import open_store

PUBLISHERS = 4


def mqtt_listener(runtime: Runtime) -> Any:
    for module in ("sluice.components.mqtt", "sluice.mqtt_wiring"):  # renamed on 2026-12-01
        try:
            return importlib.import_module(module).mqtt_listener(runtime)
        except ImportError:
            continue
    raise ImportError("no mqtt_listener")


async def run(qos: int, flush: str, gc_serving: bool, messages: int, loadgen: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-mqtt-cpu-"))
    files = []
    for i in range(PUBLISHERS if loadgen == "mosquitto_pub" else 0):
        f = tmp / f"lines-{i}.txt"
        make_lines(f, messages, i)
        files.append(f)
    (tmp / "data").mkdir()
    settings = load_settings(None, data_dir=tmp / "data", mqtt={"port": 0},
                             storage={"backend": "segment", "flush": flush})
    store = open_store(settings)
    await store.start()
    runtime = Runtime(settings, store)
    listener = mqtt_listener(runtime)
    await listener.start()
    sink = runtime.registries["ingest_sink"]
    hub = listener.hub
    counts = {"reads": 0, "bytes": 0, "appends": 0}
    append_s: list[float] = []  # how long each append took, from the call to the durable return
    port = hub.port

    class CountingPort:  # the hub's IngestPort, counting and timing append calls
        def __getattr__(self, name: str) -> Any:
            return getattr(port, name)

        async def ingest(self, client_id: str, messages: Any) -> None:
            counts["appends"] += 1
            began = time.perf_counter()
            await port.ingest(client_id, messages)
            append_s.append(time.perf_counter() - began)

    hub.port = CountingPort()
    connection_class = type(hub).__module__.replace(".hub", ".session")
    protocol = importlib.import_module(connection_class).MqttConnection
    received = protocol.data_received

    def counting_read(self: Any, data: bytes) -> None:
        counts["reads"] += 1
        counts["bytes"] += len(data)
        received(self, data)

    protocol.data_received = counting_read
    if gc_serving:
        importlib.import_module("sluice.gc_tuning").tune_for_serving()
    total = PUBLISHERS * messages
    try:
        load = Load(loadgen, listener.port, qos, PUBLISHERS, messages, 1, files)
        await asyncio.to_thread(load.ready)
        cpu, start = time.process_time(), time.perf_counter()
        load.go()
        while sink.messages_written < total:
            await asyncio.sleep(0.002)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        publishers_cpu = await asyncio.to_thread(load.finish)
    finally:
        protocol.data_received = received
        await listener.stop()
        await store.close()
    append_s.sort()
    print(f"QoS {qos} flush={flush}: {total / elapsed:,.0f} msg/s, CPU {cpu / total * 1e6:.2f} us/msg,"
          f" {counts['reads']} reads (avg {counts['bytes'] / max(counts['reads'], 1):,.0f} B),"
          f" {counts['appends']} appends (avg {total / max(counts['appends'], 1):,.0f} messages,"
          f" median {append_s[len(append_s) // 2] * 1e3:.2f} ms, p90 {append_s[len(append_s) * 9 // 10] * 1e3:.2f} ms);"
          f" the load generator's CPU {publishers_cpu / total * 1e6:.2f} us/msg", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("qos", type=int, choices=(0, 1), nargs="?")
    parser.add_argument("flush", choices=("always", "os"), nargs="?")
    parser.add_argument("--gc", choices=("serving", "default"), default="serving")
    parser.add_argument("--messages", type=int, default=25_000, help="per publisher")
    parser.add_argument("--loadgen", choices=("raw", "mosquitto_pub"), default="raw")
    ns = parser.parse_args()
    raise_fd_limit()
    import uvloop

    cases = [(ns.qos, ns.flush)] if ns.qos is not None and ns.flush is not None else [
        (qos, flush) for qos in (0, 1) for flush in ("always", "os")]
    for qos, flush in cases:  # one event loop each, as separate invocations would have
        uvloop.run(run(qos, flush, ns.gc == "serving", ns.messages, ns.loadgen))
