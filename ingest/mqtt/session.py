"""The asyncio adapter of one MQTT connection: carries out what its ``ConnectionMachine`` decides.

The rules live in ``machine.py`` and ``publish_in.py`` (sans-IO); this module only moves bytes and runs the append loop:

* It reads into one buffer shared by every connection (``READ_SIZE``), hands the bytes to the machine
  with the time, and carries out the actions it returns (writes, close, pause/resume reading, the append
  loop, the linger timer). It is the ``Link`` the hub and the sessions use to reach the client.
* Parking (plain TCP, ``parking.py``): a connection accepted by a ``ParkingLot`` starts without a transport
  (its ``ParkedSocket`` stands in), gets one when it becomes busy, and the hub's sweep parks it again once
  it has been quiet for the lot's ``park_after_s`` (``check_timeout``). The machine never knows.
* Admission: beyond the hub's connection caps (total, per client address) a socket is closed as soon as it
  is accepted, before CONNECT is read (as Mosquitto does at max_connections); see ``ingest/admission.py``.

Transports: ``MqttConnection`` works over anything with the ``ByteTransport`` methods below, which every
``asyncio.Transport`` has (TCP, and TLS through ``create_server(ssl=...)``). Another framing (MQTT over
WebSockets) drives the same class: call ``connection_made(transport)`` with an object that has these
methods (``write`` sends one binary message's worth of bytes), ``data_received(bytes)`` for each message
payload, and ``connection_lost(exc)`` when the underlying connection is gone (also after ``close()``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Any, Protocol

from broker.security.tls import peer_common_name
from ingest.mqtt.actions import CONNECTED, Do, Linger
from ingest.mqtt.hub import Hub
from ingest.mqtt.machine import LINGER_QUIET_S, ConnectionMachine
from ingest.mqtt.packets import Packet, Publish
from ingest.mqtt.parking import ParkedSocket, ParkingLot
from ingest.mqtt.session_state import SessionState
from ingest.mqtt.tls_peer import peer_ended, tls_socket

__all__ = ["READ_SIZE", "ByteTransport", "MqttConnection", "SessionState"]  # SessionState: re-exported

log = logging.getLogger("ingest.mqtt")

# One read buffer shared by every connection: a read is handled synchronously (decoded, and any partial
# packet copied into that connection's decoder) before the next read, so idle connections hold no buffer,
# and one read never brings in more than this many bytes. 256 KiB rather than 64: a busy publisher's
# read then carries ~2,000 small messages, so the per-read and per-append costs (and, with flush=always,
# each fsync) are shared by four times as many (bench_mqtt_cpu, QoS 0: ~15 % less CPU per message).
READ_SIZE = 256 * 1024
_READ_VIEW = memoryview(bytearray(READ_SIZE))
_ENDED = object()  # _tls_socket once the TLS client's end of stream was seen


def _coalesced(actions: list[bytes | Do | Linger]) -> list[bytes | Do | Linger]:
    """``actions`` with each run of consecutive writes joined into one: a read of a subscriber's PUBACKs
    sends as many PUBLISHes (one each from its queue), and a write is a system call and a wake-up of the
    client (bench_mqtt_durable, ``online``: one write per message before)."""
    out: list[bytes | Do | Linger] = []
    run: list[bytes] = []
    for action in actions:
        if type(action) is bytes:
            run.append(action)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else b"".join(run))
            run = []
        out.append(action)
    if run:
        out.append(run[0] if len(run) == 1 else b"".join(run))
    return out


class ByteTransport(Protocol):
    """What the adapter needs from a transport (a subset of ``asyncio.Transport``)."""

    def write(self, data: bytes) -> None:
        """Queue ``data`` for the client, in order; never blocks."""

    def close(self) -> None:
        """Flush what was written, then close; ``connection_lost`` follows (once)."""

    def is_closing(self) -> bool: ...

    def pause_reading(self) -> None:
        """Stop calling ``data_received``/``buffer_updated`` until ``resume_reading`` (backpressure)."""

    def resume_reading(self) -> None: ...

    def get_write_buffer_size(self) -> int:
        """Bytes written and not yet sent (QoS 0 deliveries are dropped above ``max_write_buffer``)."""
        ...

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``"peername"``: (host, port, ...) of the client, for admission and logs; ``"ssl_object"``: the TLS
        connection (None without TLS), for a client certificate's Common Name."""


class MqttConnection(asyncio.BufferedProtocol):
    """One client connection: the transport side of a ``ConnectionMachine``; the hub's ``Link`` to it."""

    __slots__ = ("_address", "_admitted", "_tls_socket", "lot", "machine", "transport")

    def __init__(self, hub: Hub, lot: ParkingLot | None = None) -> None:
        self.machine = ConnectionMachine(hub, self, time.monotonic())
        self.transport: ByteTransport | None = None
        self.lot = lot  # parks this connection when it is idle (plain TCP only)
        self._address = "?"
        self._admitted = False
        self._tls_socket: Any = None  # TLS: the TCP socket, to see the client's end of stream (tls_peer.py)

    # ------------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport | ByteTransport) -> None:
        parked = self.transport
        if type(parked) is ParkedSocket and self._admitted:  # unparked: the transport takes over the socket
            self.transport = transport  # type: ignore[assignment]
            if parked.hand_over(transport):  # type: ignore[arg-type]  # reads paused (backpressure)
                asyncio.get_running_loop().call_soon(self._keep_paused, transport)
            return
        self.transport = t = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        peer = t.get_extra_info("peername")
        hub = self.machine.hub
        # interned: the connections of one address share the string (the admission counts hold it too)
        self._address = sys.intern(str(peer[0])) if isinstance(peer, tuple) and peer else "?"
        if hub.admission.admit(self._address) is not None:  # over a connection cap: closed unread
            self.machine.lost()
            t.close()
            return
        self._admitted = True
        tls = t.get_extra_info("ssl_object")
        if tls is not None:  # a verified client certificate logs the client in (connect.py rule 2)
            self.machine.certificate_user = peer_common_name(tls)
            self._tls_socket = tls_socket(t)
        self.machine.last_rx = time.monotonic()
        hub.connections.add(self)
        hub.stats.connections_total += 1
        hub.port.connections_changed(1)

    def _keep_paused(self, transport: Any) -> None:
        """A transport that took over a parked socket with reads paused: uvloop starts reading after
        ``connection_made`` whatever it was told there, so it is paused again here, unless the machine has
        resumed reading (or closed) since."""
        machine, t = self.machine, self.transport
        if t is None or t is not transport or not machine.paused or machine.state != CONNECTED:
            return
        if not t.is_closing():
            t.pause_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return _READ_VIEW

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(_READ_VIEW[:nbytes]))

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def data_received(self, data: bytes) -> None:
        actions = self.machine.receive(data, time.monotonic(), int(time.time() * 1000))
        if actions:
            self._carry_out(actions)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        hub = self.machine.hub
        hub.admission.release(self._address)
        hub.connections.discard(self)
        hub.port.connections_changed(-1)
        self.machine.lost()

    def pause_writing(self) -> None:  # the client is slow to read what we send (QoS 0: can_take_qos0)
        pass

    def resume_writing(self) -> None:
        pass

    # ------------------------------------------------------------------ actions
    def _carry_out(self, actions: list[bytes | Do | Linger]) -> None:
        transport = self.transport
        if transport is None:
            return
        ended = self._tls_socket is not None and self._tls_peer_ended()
        if len(actions) > 1 and not ended:  # one write (one system call) for the packets of one call
            actions = _coalesced(actions)
        for action in actions:
            if action is Do.START_APPENDING:  # accepted publishes are stored even when the client is gone
                self.machine.hub.spawn(self._append_loop())
            elif ended or transport.is_closing():
                # Closed before connection_lost was delivered (uvloop closes a reset socket at once and reports
                # it on a later turn), or a TLS client ended its side (its TLS layer is shutting down: it drops
                # writes and logs them, tls_peer.py): what is left for this socket has nowhere to go.
                continue
            elif type(action) is bytes:
                transport.write(action)
            elif action is Do.CLOSE:
                transport.close()
            elif action is Do.PAUSE_READING:
                transport.pause_reading()
            elif action is Do.RESUME_READING:
                transport.resume_reading()
            elif isinstance(action, Linger):
                asyncio.get_running_loop().call_later(LINGER_QUIET_S, self._end_linger, action.until)

    def _tls_peer_ended(self) -> bool:
        if self._tls_socket is _ENDED:
            return True
        if peer_ended(self._tls_socket):
            self._tls_socket = _ENDED  # for good: no more system calls for this connection
            return True
        return False

    async def _append_loop(self) -> None:
        machine = self.machine
        port = machine.hub.port
        while (batch := machine.take_batch()) is not None:
            try:
                await port.ingest(machine.client_id, batch)
            except Exception as exc:
                actions = machine.append_failed(batch, exc)
            else:
                actions = machine.appended(batch)
                session = machine.session
                journaled = machine.hub.journaled(session, batch) if session is not None else None
                if journaled is not None:  # durable sessions: acks wait for the journal (session_store.py)
                    try:
                        await journaled
                    except Exception:  # logged by the journal; nothing is acknowledged, the client resends
                        actions = [Do.CLOSE]
            if actions:
                self._carry_out(actions)

    def _end_linger(self, until: float) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.machine.linger_over(time.monotonic(), until):
            transport.close()
        else:
            asyncio.get_running_loop().call_later(LINGER_QUIET_S, self._end_linger, until)

    # ------------------------------------------------------------------ Link (ports.py)
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
        t = self.transport
        return (
            self.machine.state == CONNECTED and t is not None
            and t.get_write_buffer_size() < self.machine.hub.config.max_write_buffer
        )

    def send(self, packet: Packet) -> None:
        self._carry_out(self.machine.send(packet))

    def send_publish(self, packet: Publish) -> None:
        self._carry_out(self.machine.send_publish(packet))

    def send_acks(self, data: bytes) -> None:
        self._carry_out(self.machine.send_acks(data))

    def take_over(self) -> None:
        self._carry_out(self.machine.take_over())

    def shutdown(self, reason: int) -> None:
        self._carry_out(self.machine.shutdown(reason))

    def check_timeout(self, now: float) -> None:
        self._carry_out(self.machine.tick(now))
        lot = self.lot
        if lot is None:
            return
        t = self.transport
        if type(t) is ParkedSocket:
            t.reads = 0  # busy means many reads between two sweeps (parking.py rule 2)
            return
        machine = self.machine
        if (t is not None and machine.state == CONNECTED and not machine.paused and not t.is_closing()
                and now - machine.last_rx >= lot.park_after_s and not t.get_write_buffer_size()):
            parked = lot.park(t, self)  # type: ignore[arg-type]  # parking.py rule 3
            if parked is not None:
                self.transport = parked

    def peername(self) -> Any:
        return self.transport.get_extra_info("peername") if self.transport is not None else None
