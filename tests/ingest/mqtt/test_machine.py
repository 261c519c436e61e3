"""The connection state machine without sockets (``ingest/mqtt/machine.py``): property tests of its rules.

A ``Harness`` plays the adapter: it feeds bytes, carries out the returned actions into a byte buffer,
and runs appends only when the test says, so "acknowledged only after the durable append" is checked
at every step, not just at the end.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.mqtt.actions import CLOSED, CONNECTED, Do, Linger
from ingest.mqtt.codec import Decoder, encode
from ingest.mqtt.hub import Hub, HubConfig
from ingest.mqtt.machine import ConnectionMachine
from ingest.mqtt.packets import (
    MQTT_5,
    MQTT_311,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Reason,
)
from ingest.mqtt.ports import Accepted


class NullPort:
    """The durable append is driven by the harness (take_batch / appended), never through this."""

    async def ingest(self, client_id: str, messages: Sequence[Accepted]) -> None:
        raise AssertionError("the harness appends")

    def backlog_bytes(self) -> int:
        return 0

    def connections_changed(self, delta: int) -> None:
        pass

    def reads_paused(self, paused: bool) -> None:
        pass


class Harness:
    """An adapter without a transport: output bytes, close and the append loop, under the test's control."""

    def __init__(self, hub: Hub, now: float = 0.0) -> None:
        self.machine = ConnectionMachine(hub, self, now)
        self.wire = bytearray()
        self.closed = False
        self.lingering = False
        self.appending = False
        self.stored: list[Accepted] = []  # appended, in append order
        self.written_after_close = b""

    def run(self, actions: list[bytes | Do | Linger]) -> None:
        for action in actions:
            if isinstance(action, bytes):
                if self.closed or self.lingering:
                    self.written_after_close += action
                self.wire += action
            elif action is Do.CLOSE:
                self.closed = True
            elif action is Do.START_APPENDING:
                assert not self.appending, "a second append loop"
                self.appending = True
            elif isinstance(action, Linger):
                self.lingering = True

    def feed(self, data: bytes, now: float = 0.0) -> None:
        self.run(self.machine.receive(data, now, 1_000))

    def complete_appends(self) -> None:
        while self.appending:
            batch = self.machine.take_batch()
            if batch is None:
                self.appending = False
                return
            self.stored.extend(batch)
            self.run(self.machine.appended(batch))

    def received(self, version: int) -> list[Packet]:
        return Decoder(version).feed(bytes(self.wire))

    # Link / Endpoint
    @property
    def client_id(self) -> str:
        return self.machine.client_id

    @property
    def keepalive(self) -> int:
        return self.machine.keepalive

    @property
    def client_receive_max(self) -> int:
        return self.machine.client_receive_max

    def can_take_qos0(self) -> bool:
        return self.machine.state == CONNECTED

    def send(self, packet: Packet) -> None:
        self.run(self.machine.send(packet))

    def send_publish(self, packet: Publish) -> None:
        self.run(self.machine.send_publish(packet))

    def send_acks(self, data: bytes) -> None:
        self.run(self.machine.send_acks(data))

    def take_over(self) -> None:
        self.run(self.machine.take_over())

    def shutdown(self, reason: int) -> None:
        self.run(self.machine.shutdown(reason))

    def check_timeout(self, now: float) -> None:
        self.run(self.machine.tick(now))

    def peername(self) -> Any:
        return ("test", 0)


def new_hub(**config: Any) -> Hub:
    return Hub(NullPort(), HubConfig(**config))


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, start = [], 0
    for p in [*points, len(data)]:
        if p > start:
            out.append(data[start:p])
            start = p
    return out


# A client's packets after CONNECT: publishes at every QoS with packet ids from a small range (so retries
# and QoS 2 duplicates happen), PUBRELs, PINGREQs; "append" marks where the broker's appends complete.
publishes = st.builds(
    lambda qos, pid, n: Publish(f"t/{n}", b"x%d" % n, qos, packet_id=pid if qos else None),
    st.integers(0, 2), st.integers(1, 6), st.integers(0, 3),
)
steps = st.lists(
    st.one_of(publishes, st.builds(Pubrel, st.integers(1, 6)), st.just(Pingreq()), st.just("append")),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(version=st.sampled_from([MQTT_311, MQTT_5]), script=steps, cuts=st.lists(st.integers(0, 10_000)))
def test_acks_only_after_the_append_in_arrival_order(version: int, script: list[Any], cuts: list[int]) -> None:
    """Rules 3 and 4: a PUBACK/PUBREC is written only for a message whose batch was appended, acks leave in
    append order, each accepted QoS 1/2 message is acked exactly once, a retry of a message still being
    appended is dropped, and a QoS 2 id awaiting PUBREL is answered with PUBREC without a second append."""
    h = Harness(new_hub())
    h.feed(encode(Connect("c", version), version))
    acked: list[int] = []  # packet ids in the order their acks were written
    for step in script:
        before = len(h.received(version))
        if step == "append":
            h.complete_appends()
        else:
            for part in chunks(encode(step, version), cuts):
                h.feed(part)
        stored_ids = [pid for _, pid, _ in h.stored if pid]
        for packet in h.received(version)[before:]:
            if isinstance(packet, Puback | Pubrec) and packet.reason_code == 0:
                acked.append(packet.packet_id)
        # every ack so far belongs to a stored message, and they came out in the order of storing,
        # except the repeated PUBRECs of rule 4 (a duplicate QoS 2 PUBLISH while its PUBREL is awaited)
        assert set(acked) <= set(stored_ids)
    h.complete_appends()
    assert not h.closed
    packets = h.received(version)
    assert isinstance(packets[0], Connack) and packets[0].reason_code == 0
    first_acks = []  # PUBACKs and PUBRECs, leaving out the PUBRECs repeated for a duplicate (rule 4)
    awaiting_rel: set[int] = set()
    for packet in packets:
        if isinstance(packet, Puback):
            first_acks.append(packet.packet_id)
        elif isinstance(packet, Pubrec):
            if packet.packet_id not in awaiting_rel:
                first_acks.append(packet.packet_id)
            awaiting_rel.add(packet.packet_id)
        elif isinstance(packet, Pubcomp):
            awaiting_rel.discard(packet.packet_id)
    assert first_acks == [pid for _, pid, _ in h.stored if pid]
    # PINGREQ always answered, PUBREL always completed
    assert sum(isinstance(p, Pingresp) for p in packets) == sum(isinstance(s, Pingreq) for s in script)
    assert sum(isinstance(p, Pubcomp) for p in packets) == sum(isinstance(s, Pubrel) for s in script)


@settings(max_examples=200, deadline=None)
@given(version=st.sampled_from([MQTT_311, MQTT_5]), script=steps, cuts=st.lists(st.integers(0, 10_000)))
def test_split_reads_change_nothing(version: int, script: list[Any], cuts: list[int]) -> None:
    """Bytes cut anywhere (down to one byte per read) give the same answers and the same stored messages
    as whole packets, when the appends complete at the same points."""
    whole, split = Harness(new_hub()), Harness(new_hub())
    for h in (whole, split):
        h.feed(encode(Connect("c", version), version))
    for step in script:
        if step == "append":
            whole.complete_appends()
            split.complete_appends()
            continue
        data = encode(step, version)
        whole.feed(data)
        for part in chunks(data, cuts):
            split.feed(part)
    whole.complete_appends()
    split.complete_appends()
    assert bytes(whole.wire) == bytes(split.wire)
    assert [m for m, _, _ in whole.stored] == [m for m, _, _ in split.stored]


@settings(max_examples=100, deadline=None)
@given(first=st.one_of(publishes, st.just(Pingreq()), st.builds(Pubrel, st.integers(1, 6))))
def test_only_connect_opens_a_connection(first: Packet) -> None:
    """Rule 1: any other first packet closes the connection without an answer."""
    h = Harness(new_hub())
    h.feed(encode(first, MQTT_311))
    assert h.closed and not h.wire and h.machine.state == CLOSED


@settings(max_examples=100, deadline=None)
@given(version=st.sampled_from([MQTT_311, MQTT_5]), keepalive=st.integers(1, 600), wait=st.floats(0, 2000))
def test_keepalive(version: int, keepalive: int, wait: float) -> None:
    """Rule 7: closed once 1.5 x the keep alive passes without a packet (5.0: DISCONNECT 0x8D first)."""
    h = Harness(new_hub())
    h.feed(encode(Connect("k", version, keepalive=keepalive), version), now=10.0)
    h.wire.clear()
    h.check_timeout(10.0 + wait)
    expired = wait > 1.5 * keepalive
    assert h.closed == expired
    if expired and version == MQTT_5:
        (packet,) = h.received(version)
        assert isinstance(packet, Disconnect) and packet.reason_code == Reason.KEEP_ALIVE_TIMEOUT
    else:
        assert not h.wire


@settings(max_examples=100, deadline=None)
@given(script=steps, extra=st.lists(publishes, min_size=1, max_size=5))
def test_nothing_written_after_close(script: list[Any], extra: list[Publish]) -> None:
    """Rule 12: after DISCONNECT nothing more is written, later input is discarded, and what was accepted
    before it is still appended and acknowledged only if the connection is still there (it is not)."""
    h = Harness(new_hub())
    h.feed(encode(Connect("c", MQTT_5), MQTT_5))
    for step in script:
        if step == "append":
            h.complete_appends()
        else:
            h.feed(encode(step, MQTT_5))
    h.feed(encode(Disconnect(), MQTT_5))
    assert h.closed
    h.complete_appends()  # what was accepted before the DISCONNECT is still stored, but not acknowledged
    stored = len(h.stored)
    for packet in extra:
        h.feed(encode(packet, MQTT_5))
    h.complete_appends()
    assert h.written_after_close == b""
    assert len(h.stored) == stored and not h.appending


def test_receive_maximum_exceeded_lingers() -> None:
    """Rule 10: one QoS 1 message above Receive Maximum → DISCONNECT 0x93, then Linger (no close yet)."""
    h = Harness(new_hub(receive_maximum=2))
    h.feed(encode(Connect("r", MQTT_5), MQTT_5))
    h.feed(b"".join(encode(Publish("t", b"", 1, packet_id=i), MQTT_5) for i in (1, 2, 3)))
    last = h.received(MQTT_5)[-1]
    assert isinstance(last, Disconnect) and last.reason_code == Reason.RECEIVE_MAXIMUM_EXCEEDED
    assert h.lingering and not h.closed
    assert not h.machine.linger_over(0.1, 2.0) and h.machine.linger_over(0.2, 2.0)
    h.complete_appends()  # the two accepted before the error are still appended, but not acknowledged
    assert len(h.stored) == 2 and h.written_after_close == b""


def test_modules_import_alone_without_a_circle() -> None:
    """Item 10: each MQTT module imports on its own in a fresh interpreter (no import circle), and the hub
    and session state do not import the state machine or its adapter."""
    modules = ["ports", "hub_config", "session_state", "hub", "connect", "actions", "publish_in", "machine", "session",
               "listener", "subscribe"]
    for name in modules:
        done = subprocess.run([sys.executable, "-c", f"import ingest.mqtt.{name}"], capture_output=True, text=True)
        assert done.returncode == 0, (name, done.stderr)
    for name in ("hub", "session_state", "ports", "hub_config", "connect", "actions", "publish_in"):
        source = importlib.import_module(f"ingest.mqtt.{name}").__file__
        assert source is not None
        with open(source) as f:
            text = f.read()
        assert "ingest.mqtt.session " not in text and "ingest.mqtt.machine" not in text, name
        assert "from ingest.mqtt.session import" not in text, name
