"""Compaction of the MQTT journals (``__mqtt_sessions``, ``__mqtt_retained``) by the generic log cleaner
(``broker/log/cleaner.py``) on the segment store: after churning sessions, queued messages, wills and
retained messages, a cleaner pass shrinks both topics and a restore from the cleaned log gives exactly
the state a restore gave before; once ``delete.retention.ms`` has passed, a second pass removes the
tombstones, and the restored state is still the same."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from broker.log.cleaner import CleanStats, LogCleaner
from broker.log.segment import SegmentLogStore
from broker.protocol.records import decode_records, iter_batches
from ingest.mqtt.hub import Hub
from ingest.mqtt.journal import Journal
from ingest.mqtt.packets import (
    MQTT_5,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
    Will,
)
from ingest.mqtt.session_store import RETAINED_TOPIC, SESSIONS_TOPIC
from tests.broker.log.helpers import FakeClock
from tests.ingest.mqtt.conftest import RawClient, StartServer, wait_until

JOURNALS = (SESSIONS_TOPIC, RETAINED_TOPIC)
EXPIRY = Properties(session_expiry_interval=3600)


async def connect(port: int, client_id: str, *, clean: bool = False, will: Will | None = None,
                  persistent: bool = True) -> RawClient:
    client = await RawClient.open(port, MQTT_5)
    await client.connect(client_id, clean_start=clean, properties=EXPIRY if persistent else Properties(), will=will)
    return client


async def publish(port: int, messages: list[tuple[str, bytes, bool]]) -> None:
    """QoS 1, each acknowledged (so journaled) before the next."""
    pub = await connect(port, "churn-pub", clean=True, persistent=False)
    for pid, (topic, payload, retain) in enumerate(messages, start=1):
        pub.send(Publish(topic, payload, 1, retain, False, pid))
        assert await pub.recv() == Puback(pid)
    pub.send(Disconnect())
    await pub.close()


async def churn(port: int) -> None:
    """Sessions that come and go, messages queued and acknowledged, wills, retained messages rewritten."""
    for i in range(12):
        sub = await connect(port, f"churn-{i}", clean=True)
        sub.send(Subscribe(1, (Subscription("churn/#", 1),), Properties(subscription_identifier=(i + 1,))))
        assert isinstance(await sub.recv(), Suback)
        sub.send(Disconnect())
        await sub.close()
    retained = [(f"churn/r{t}", b"v%d" % n, True) for n in range(8) for t in range(10)]
    deleted = [(f"churn/r{t}", b"", True) for t in range(3)]  # empty retained payload: deleted
    await publish(port, [("churn/q", b"q%d" % n, False) for n in range(10)] + retained + deleted)
    for i in range(6):  # these take their queues and acknowledge everything (m records become tombstones)
        sub = await connect(port, f"churn-{i}")
        got = 0
        while got < 10 + len(retained) + len(deleted):  # a deletion is delivered too (empty payload)
            packet = await sub.recv()
            assert isinstance(packet, Publish)
            sub.send(Puback(packet.packet_id or 0))
            got += 1
        sub.send(Pingreq())
        assert isinstance(await sub.recv(), Pingresp)
        if i < 3:  # and these end their sessions (every record of theirs becomes a tombstone)
            sub.send(Disconnect(properties=Properties(session_expiry_interval=0)))
        await sub.close()
    for client_id in ("churn-will-a", "churn-will-b"):  # wills pending for an hour
        will = await connect(port, client_id, clean=True,
                             will=Will(f"will/{client_id}", b"gone", 1, False, Properties(will_delay_interval=3600)))
        await will.close()


def restored(hub: Hub) -> dict[str, Any]:
    """What a restore rebuilt: every session (subscriptions, queue, in flight, QoS 2 ids), pending wills and
    retained messages."""
    sessions = {
        cid: (dict(s.subscriptions), [(p.packet_id, p.payload, p.dup, p.properties) for p, _, _ in s.queue or ()],
              dict(s.inflight_out), sorted(s.awaiting_rel), s.expiry_s)
        for cid, s in hub.sessions.items()
    }
    wills = {cid: will for cid, (_, will) in hub.delayed_wills.items()}
    retained = {m.topic: (m.payload, m.qos, m.properties) for m, _ in hub.retained.matching("#", time.monotonic())}
    return {"sessions": sessions, "wills": wills, "retained": retained}


def tombstones(store: SegmentLogStore, topic: str) -> int:
    plog = store.partition(topic, 0)
    data = plog.read(plog.log_start_offset, plog.size_bytes + 1)
    count = 0
    for pos, header in iter_batches(data):
        count += sum(r.value is None for r in decode_records(memoryview(data)[pos: pos + header.size], header))
    return count


async def roll(clock: FakeClock, port: int, advance_s: float, mark: str) -> None:
    """Move the store's clock and append to both journals: their active segments roll, closing the
    segments written before (the roll flushes them in the background)."""
    clock.now += advance_s
    roller = await connect(port, f"roll-{mark}")  # a session record
    roller.send(Subscribe(1, (Subscription(f"roll/{mark}", 1),)))
    assert isinstance(await roller.recv(), Suback)
    await roller.close()
    await publish(port, [(f"roll/{mark}", b"r", True)])  # a retained record


async def clean(store: SegmentLogStore, clock: FakeClock) -> dict[str, CleanStats]:
    """One cleaner pass over both journals, once their closed segments are fsynced."""
    cleaner = LogCleaner(store, clock=clock)
    deadline = time.monotonic() + 10
    while True:
        stats = {s.topic: s for s in await cleaner.clean_once()}
        if stats.keys() >= set(JOURNALS):
            return stats
        assert time.monotonic() < deadline, f"journals not cleaned: {stats}"
        await asyncio.sleep(0.05)


async def test_cleaning_the_journals_shrinks_them_and_restores_the_same_state(
    start_server: StartServer, tmp_path: Path,
) -> None:
    clock = FakeClock(time.time())
    store = SegmentLogStore(tmp_path / "logs", clock=clock)
    first = await start_server(store)
    await churn(first.port)
    await wait_until(lambda: first.hub.stats.wills_published == 0 and len(first.hub.delayed_wills) == 2,
                     what="wills pending")
    await roll(clock, first.port, 2 * 3600, "a")
    before = await start_server(store)  # a restore from the log as it is ...
    loads = {topic: Journal(store, topic).load() for topic in JOURNALS}
    sizes = {topic: store.partition(topic, 0).size_bytes for topic in JOURNALS}
    stats = await clean(store, clock)
    for topic in JOURNALS:
        assert stats[topic].records_removed > 0
        assert store.partition(topic, 0).size_bytes < sizes[topic]
        assert tombstones(store, topic) > 0  # kept until delete.retention.ms
    after = await start_server(store)  # ... and one from the cleaned log
    state = restored(before.hub)
    assert state == restored(after.hub)
    assert {topic: Journal(store, topic).load() for topic in JOURNALS} == loads
    assert len(state["sessions"]) == 12 - 3 + 2 + 1 and len(state["wills"]) == 2  # churn, wills, roll-a
    # churn-6 ... churn-11 hold every message, roll-a the retained one published after it subscribed
    assert sum(len(s[1]) for s in state["sessions"].values()) == 6 * (10 + 80 + 3) + 1
    assert len(state["retained"]) == 10 - 3 + 1

    # A day later (delete.retention.ms) the next pass removes the tombstones; the state stays the same.
    await roll(clock, first.port, 24 * 3600 + 60, "b")
    loads = {topic: Journal(store, topic).load() for topic in JOURNALS}
    before = await start_server(store)
    stats = await clean(store, clock)
    assert all(stats[topic].tombstones_removed > 0 for topic in JOURNALS)
    assert {topic: tombstones(store, topic) for topic in JOURNALS} == dict.fromkeys(JOURNALS, 0)
    after = await start_server(store)
    assert restored(before.hub) == restored(after.hub)
    assert {topic: Journal(store, topic).load() for topic in JOURNALS} == loads
