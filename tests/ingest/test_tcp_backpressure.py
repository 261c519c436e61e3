"""A sender that outruns a slowed log is slowed itself: its socket writes block, the broker's pending
bytes and memory stay bounded, and every line arrives once the log catches up."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

from ingest.health import HealthRegistry
from ingest.router import Router
from ingest.routing import RouteDefaults
from ingest.sink import IngestSink
from ingest.tcp.listener import TcpLineListener, TcpListenerConfig
from tests.ingest.conftest import GatedLogStore, SlowLogStore, records

LINE_PAD = "x" * 1000
TOTAL_LINES = 32_000  # ~32 MB: far more than every buffer between the sender and the log together
MAX_PENDING = 512 * 1024


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Sender(threading.Thread):
    """Pushes lines as fast as the socket takes them, counting how often the kernel said 'full'."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setblocking(False)
        self.sent_bytes = 0
        self.sent_lines = 0
        self.blocked = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for i in range(0, TOTAL_LINES, 100):
                chunk = "".join(
                    f'{{"device_id": "d{n % 16}", "seq": {n}, "pad": "{LINE_PAD}"}}\n' for n in range(i, i + 100)
                ).encode()
                view = memoryview(chunk)
                while view:
                    try:
                        n = self.sock.send(view)
                    except BlockingIOError:
                        self.blocked += 1
                        time.sleep(0.002)
                        continue
                    view = view[n:]
                    self.sent_bytes += n
                self.sent_lines = i + 100
            self.sock.shutdown(socket.SHUT_WR)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.sock.close()


async def test_sender_outrunning_a_stalled_log_is_blocked_and_nothing_is_lost() -> None:
    store = GatedLogStore(delay=0.002, default_partitions=4)
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry(), max_pending_bytes=MAX_PENDING)
    listener = TcpLineListener(TcpListenerConfig(port=0), sink, sink.health)
    await listener.start()
    rss_before = _rss_bytes()
    sender = Sender(listener.port)
    sender.start()
    try:
        # Phase 1: the disk is stalled. The sender must end up blocked long before it sent everything.
        peak_pending = 0
        last_progress, last_sent = time.monotonic(), -1
        while time.monotonic() - last_progress < 1.0:  # until the sender has made no progress for 1 s
            assert time.monotonic() - last_progress < 30
            if sender.sent_bytes != last_sent:
                last_sent, last_progress = sender.sent_bytes, time.monotonic()
            peak_pending = max(peak_pending, sink.pending_bytes)
            await asyncio.sleep(0.02)
        total_bytes = TOTAL_LINES * (len(LINE_PAD) + 40)
        assert sender.is_alive() and sender.error is None
        assert sender.blocked > 0
        assert sender.sent_bytes < total_bytes / 4, f"sender got {sender.sent_bytes} bytes out past a stalled log"
        assert peak_pending <= MAX_PENDING
        assert _rss_bytes() - rss_before < total_bytes / 2
        assert sink.health.snapshot()[0]["in_flight"] > 0
        print(f"stalled: sender blocked after {sender.sent_bytes} of {total_bytes} bytes, peak pending "
              f"{peak_pending}, rss +{(_rss_bytes() - rss_before) // 1024} KiB")

        # Phase 2: the disk is back (slow: 2 ms per durable append). Everything arrives, exactly once.
        store.gate.set()
        deadline = time.monotonic() + 90
        while sender.is_alive() or len(records(store, "tcp")) < TOTAL_LINES:
            assert time.monotonic() < deadline, f"{len(records(store, 'tcp'))} of {TOTAL_LINES} stored"
            peak_pending = max(peak_pending, sink.pending_bytes)
            await asyncio.sleep(0.05)
        assert sender.error is None
        assert peak_pending <= MAX_PENDING
        found = records(store, "tcp")
        seqs = sorted(int(r.value.split(b'"seq": ')[1].split(b",")[0]) for r in found if r.value)
        assert seqs == list(range(TOTAL_LINES))
        assert not store.has_topic("_dead_letters")
    finally:
        store.gate.set()
        sender.join(10)
        await listener.stop()


async def test_many_connections_share_one_budget() -> None:
    """Writers on other connections saturate the sink: an idle-reading connection pauses too."""
    store = SlowLogStore(0.005)
    sink = IngestSink(store, Router([], RouteDefaults()), HealthRegistry(), max_pending_bytes=20_000)
    # Reads of 2 KiB (~80 lines, ~7 KB charged) are well under the budget, so it is a strict bound.
    listener = TcpLineListener(TcpListenerConfig(port=0, read_bytes=2048), sink, sink.health)
    await listener.start()
    try:
        writers = []
        for i in range(20):
            _, w = await asyncio.open_connection("127.0.0.1", listener.port)
            w.write(b"".join(f'{{"device_id": "c{i}", "n": {n}}}\n'.encode() for n in range(200)))
            writers.append(w)
        await asyncio.gather(*(w.drain() for w in writers))
        for w in writers:
            w.close()
        deadline = time.monotonic() + 30
        while len(records(store, "tcp")) < 20 * 200:
            assert time.monotonic() < deadline
            assert sink.pending_bytes <= 20_000
            await asyncio.sleep(0.01)
        assert sink.health.snapshot()[0]["pauses"] >= 1
    finally:
        await listener.stop()
