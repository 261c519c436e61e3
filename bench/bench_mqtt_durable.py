"""What durable MQTT sessions cost QoS 1 ingest, side by side with Mosquitto (persistence on).

    python -m bench.bench_mqtt_durable [--publishers 4] [--messages 15000] [--runs 2] [--flush always]

Load (as ``bench_mqtt``): ``--publishers`` ``mosquitto_pub -l`` processes (MQTT 5, QoS 1, in-flight window
1000, 100 B payloads) each send ``--messages`` lines. Three cases, each on a fresh data directory:

* ``none``: no subscriber. Durability writes nothing here: the figure shows the hook costs nothing.
* ``offline``: one persistent QoS 1 subscriber (``mosquitto_sub -c -x 3600 -E``: subscribed, then gone), so
  every message is queued for it; with ``mqtt.durable`` each one is journaled in ``__mqtt_sessions``
  before its PUBACK. Time = until every publisher has all its PUBACKs (the processes exit).
* ``online``: the same subscriber connected (``mosquitto_sub -c -C <total>``); time = until it has
  received every message (it acknowledges each; the journal records and their removals are written).

Sluice runs in this process (uvloop) on the segment store, ``--flush`` (always or os), queue bounds
lifted (0) so nothing is dropped, once with ``mqtt.durable = true`` and once with ``false`` (sessions in
memory only). Mosquitto runs with ``persistence true`` (it writes its database at shutdown and every
``autosave_interval``, 1800 s by default: not before a PUBACK) and ``max_queued_messages 0``.
Reported: messages per second and the ratios durable/in-memory and durable/Mosquitto; for ``offline``,
also how long opening the durable case's data directory again takes to restore its queued messages.
Also each broker's CPU per message (Sluice: this process's user + system time over the cell, the
bench's own waiting thread included; Mosquitto: its process's, from /proc): on a shared machine the
rates follow the scheduler (a broker that uses more CPU waits longer for it), the CPU figures much less.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.bench_mqtt import make_lines, proc_cpu_s, publishers, raise_fd_limit, start_mosquitto
from broker.log.api import LogStore
from ingest.mqtt.listener import MqttListener
from ingest.mqtt.session_store import SessionStore
from sluice.components.mqtt import mqtt_listener
from sluice.config import load_settings
from sluice.runtime import Runtime
from sluice.serve import open_store

CASES = ("none", "offline", "online")
SUB_ID = "bench-durable-sub"


def subscribe_and_leave(port: int) -> None:
    """A persistent QoS 1 subscription whose client then goes away (MQTT 5, session expiry 1 h)."""
    subprocess.run(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-V", "mqttv5", "-c", "-x", "3600",
                    "-i", SUB_ID, "-q", "1", "-t", "bench/#", "-E"], check=True, timeout=30,
                   stdout=subprocess.DEVNULL)


def online_subscriber(port: int, total: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-V", "mqttv5", "-c", "-x", "3600",
                             "-i", SUB_ID, "-q", "1", "-t", "bench/#", "-C", str(total), "-W", "300"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def measure(port: int, files: list[Path], total: int, case: str) -> float:
    """Seconds from starting the publishers until the case's end (module header)."""
    if case != "none":
        subscribe_and_leave(port)
    sub = online_subscriber(port, total) if case == "online" else None
    if sub is not None:
        time.sleep(0.5)  # its CONNECT lands before the publishers start (same for both brokers)
    start = time.perf_counter()
    procs = publishers(port, 1, files)
    for p in procs:
        p.wait(300)
        assert p.returncode == 0, p.stderr.read() if p.stderr else ""
    if sub is not None:
        sub.wait(300)
        assert sub.returncode == 0, sub.stderr.read() if sub.stderr else ""
    return time.perf_counter() - start


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def sluice_case(files: list[Path], total: int, case: str, durable: bool, flush: str,
                      data_dir: Path) -> tuple[float, float]:
    """(seconds, CPU seconds of this process over the case)."""
    settings = load_settings(None, data_dir=data_dir, storage={"backend": "segment", "flush": flush},
                             mqtt={"port": 0, "durable": durable, "max_queued_messages": 0, "max_queued_bytes": 0,
                                   "max_queued_bytes_total": 0})
    data_dir.mkdir(parents=True, exist_ok=True)
    store: LogStore = open_store(settings)
    await store.start()
    listener = mqtt_listener(Runtime(settings, store))
    assert isinstance(listener, MqttListener)
    await listener.start()
    try:
        cpu = own_cpu_s()
        elapsed = await asyncio.to_thread(measure, listener.port, files, total, case)
        cpu = own_cpu_s() - cpu
        if case == "offline":  # every message is queued for the absent subscriber (nothing dropped)
            session = listener.hub.sessions[SUB_ID]
            assert session.queue is not None and len(session.queue) == total, len(session.queue or ())
        return elapsed, cpu
    finally:
        await listener.stop()
        await store.close()


async def restore_seconds(total: int, flush: str, data_dir: Path) -> float:
    """Open the ``offline`` case's data directory again: seconds to restore its queued messages."""
    settings = load_settings(None, data_dir=data_dir, storage={"backend": "segment", "flush": flush},
                             mqtt={"port": 0, "max_queued_messages": 0, "max_queued_bytes": 0,
                                   "max_queued_bytes_total": 0})
    store: LogStore = open_store(settings)
    await store.start()
    try:
        start = time.perf_counter()
        listener = mqtt_listener(Runtime(settings, store))  # the restore happens here
        elapsed = time.perf_counter() - start
        assert isinstance(listener, MqttListener) and isinstance(listener.hub.store, SessionStore)
        assert listener.hub.store.restored.messages == total, listener.hub.store.restored
        return elapsed
    finally:
        await store.close()


def mosquitto_case(files: list[Path], total: int, case: str, directory: Path) -> tuple[float, float]:
    """(seconds, Mosquitto's CPU seconds over the case)."""
    proc, port = start_mosquitto(directory)
    try:
        cpu = proc_cpu_s(proc.pid)
        elapsed = measure(port, files, total, case)
        return elapsed, proc_cpu_s(proc.pid) - cpu
    finally:
        proc.terminate()
        proc.wait()


async def main(args: argparse.Namespace) -> None:
    raise_fd_limit()
    tmp = Path(tempfile.mkdtemp(prefix="bench-mqtt-durable-"))
    try:
        total = args.publishers * args.messages
        files = []
        for i in range(args.publishers):
            f = tmp / f"lines-{i}.txt"
            make_lines(f, args.messages, i)
            files.append(f)
        print(f"{args.publishers} x mosquitto_pub -l -q 1, {args.messages} msgs each ({total} total), "
              f"Sluice flush={args.flush}")
        # imports, the first topic's creation: not in the first cell's CPU figure
        await sluice_case(files[:1], args.messages, "none", False, args.flush, tmp / "warm-up")
        for case in args.cases.split(","):
            for run in range(args.runs):
                on, on_cpu = await sluice_case(files, total, case, True, args.flush, tmp / f"on-{case}-{run}")
                off, off_cpu = await sluice_case(files, total, case, False, args.flush, tmp / f"off-{case}-{run}")
                mdir = tmp / f"mosq-{case}-{run}"
                mdir.mkdir()
                mosq, mosq_cpu = await asyncio.to_thread(mosquitto_case, files, total, case, mdir)
                us = 1e6 / total
                print(f"{case:8s} run {run + 1}: Sluice durable {total / on:,.0f} msg/s, in-memory sessions "
                      f"{total / off:,.0f} msg/s, Mosquitto (persistence on) {total / mosq:,.0f} msg/s; "
                      f"durable/in-memory {off / on:.2f}x, durable/Mosquitto {mosq / on:.2f}x; CPU per message: "
                      f"durable {on_cpu * us:.1f} us, in-memory {off_cpu * us:.1f} us, Mosquitto "
                      f"{mosq_cpu * us:.1f} us", flush=True)
                if case == "offline":
                    took = await restore_seconds(total, args.flush, tmp / f"on-{case}-{run}")
                    print(f"         restart: {total} queued messages restored in {took:.2f} s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=15_000)  # a persistent session holds < 65,536 messages
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--flush", choices=("always", "os"), default="always")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    ns = parser.parse_args()
    try:
        import uvloop

        uvloop.run(main(ns))
    except ImportError:
        asyncio.run(main(ns))
