"""The MQTT bridge: a persistent QoS 1 subscription on an external broker, acknowledged after the append.

For each external broker the bridge keeps one aiomqtt client with a fixed client id and a persistent
session (3.1.1 clean session = 0, or 5.0 clean start = 0 with a long session expiry), so the broker
queues messages while Sluice is down. paho's manual acknowledgements are switched on *before* the
connection is made (a persistent session delivers queued messages right after CONNACK), and each
message's PUBACK is sent only after ``write`` — the durable append through the ingest sink — has
returned. A crash of Sluice between receipt and append therefore loses nothing: the broker redelivers
(at least once). Messages are written in small batches of whatever has already arrived, acked in order.

aiomqtt 2.x has no public manual-ack API yet (empicano/aiomqtt#345, PR #346); the documented
workaround is the underlying paho client: ``client._client.manual_ack_set(True)`` and
``client._client.ack(mid, qos)``. A new aiomqtt client is made per connection attempt, so an ack can
never reach a later connection where the same packet id means another message.

Errors: connection failures are retried with exponential backoff (``backoff_initial_s`` doubling up to
``backoff_max_s``, reset after a successful connection); a failed append disconnects without acking,
so the broker redelivers. ``status`` (connected, last message time, counts, last error) is what the
HTTP API shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from ingest.routing import RawMessage

__all__ = ["BridgeConfig", "BridgeStatus", "MqttBridge", "WriteMessages"]

log = logging.getLogger("ingest.bridge")

WriteMessages = Callable[[Sequence[RawMessage]], Awaitable[Any]]
_MAX_BATCH = 500


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    name: str
    host: str
    port: int = 1883
    topics: tuple[str, ...] = ("#",)
    client_id: str = "sluice-bridge"
    username: str | None = None
    password: str | None = None
    protocol: int = 4  # 4 = MQTT 3.1.1, 5 = MQTT 5.0
    keepalive_s: int = 30
    max_inflight: int = 100
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0


@dataclass(slots=True)
class BridgeStatus:
    name: str
    broker: str
    connected: bool = False
    connects: int = 0
    messages: int = 0
    bytes: int = 0
    acked: int = 0
    last_message_at: float | None = None  # unix seconds
    last_connected_at: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    subscriptions_refused: int = 0  # SUBACKs that refused a filter (counted per connection)
    topics: list[str] = field(default_factory=list)


class MqttBridge:
    """A Component-shaped object: ``start()`` spawns the connect/consume loop, ``stop()`` ends it."""

    def __init__(self, config: BridgeConfig, write: WriteMessages, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.name = f"bridge:{config.name}"
        self._write = write
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self._status = BridgeStatus(config.name, f"{config.host}:{config.port}", topics=list(config.topics))
        self.connected = asyncio.Event()

    def status(self) -> dict[str, Any]:
        """Connected, connects, messages, bytes, acked, last message / connect / error times, last error."""
        return asdict(self._status)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._status.connected = False
        self.connected.clear()

    def _client(self) -> aiomqtt.Client:
        cfg = self.config
        v5 = cfg.protocol == 5
        kwargs: dict[str, Any] = {}
        if v5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = 0xFFFFFFFF  # the broker keeps our session (and its queue) for ever
            kwargs.update(clean_start=False, properties=props)
        else:
            kwargs["clean_session"] = False
        client = aiomqtt.Client(
            cfg.host,
            cfg.port,
            identifier=cfg.client_id,
            username=cfg.username,
            password=cfg.password,
            protocol=aiomqtt.ProtocolVersion.V5 if v5 else aiomqtt.ProtocolVersion.V311,
            keepalive=cfg.keepalive_s,
            max_inflight_messages=cfg.max_inflight,
            logger=log,
            **kwargs,
        )
        client._client.manual_ack_set(True)  # before connecting: queued messages arrive right after CONNACK
        return client

    async def _run(self) -> None:
        cfg = self.config
        delay = cfg.backoff_initial_s
        status = self._status
        while True:
            try:
                async with self._client() as client:
                    # Connected once subscribed: a message published before the broker takes the first
                    # SUBSCRIBE of a new session is not queued for it.
                    granted = await client.subscribe([(topic, 1) for topic in cfg.topics])
                    self._check_granted(granted)
                    status.connected = True
                    status.connects += 1
                    status.last_connected_at = self._clock()
                    self.connected.set()
                    delay = cfg.backoff_initial_s
                    log.info("bridge connected", extra={"bridge": cfg.name, "broker": status.broker})
                    await self._consume(client)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # aiomqtt.MqttError, OSError, a failed append (SinkError)
                status.last_error = f"{type(exc).__name__}: {exc}"
                status.last_error_at = self._clock()
                log.warning("bridge connection failed", extra={"bridge": cfg.name, "error": status.last_error})
            status.connected = False
            self.connected.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, cfg.backoff_max_s)

    def _check_granted(self, granted: Sequence[int | ReasonCode]) -> None:
        """A filter the remote broker refused (SUBACK 0x80 and up, e.g. its ACL) brings nothing: the
        others still flow, so this is logged and shown in the status rather than ending the connection."""
        codes = zip(self.config.topics, map(_code, granted), strict=False)
        refused = {topic: code for topic, code in codes if code >= 0x80}
        if refused:
            self._status.subscriptions_refused += 1
            self._status.last_error = "subscription refused: " + ", ".join(
                f"{topic} (0x{code:02X})" for topic, code in refused.items())
            self._status.last_error_at = self._clock()
            log.error("bridge subscription refused by the broker", extra={
                "bridge": self.config.name, "broker": self._status.broker, "refused": self._status.last_error})

    async def _consume(self, client: aiomqtt.Client) -> None:
        messages = client.messages
        status = self._status
        paho_client = client._client
        while True:
            batch = [await anext(messages)]
            while len(batch) < _MAX_BATCH and len(messages) > 0:  # whatever has already arrived
                batch.append(await anext(messages))
            now_ms = int(self._clock() * 1000)
            raws = [RawMessage(_payload(m.payload), m.topic.value, None, now_ms) for m in batch]
            await self._write(raws)  # durable (or dead-lettered durably) when this returns
            for m in batch:
                paho_client.ack(m.mid, m.qos)
            status.messages += len(batch)
            status.acked += sum(1 for m in batch if m.qos > 0)
            status.bytes += sum(len(r.payload) for r in raws)
            status.last_message_at = self._clock()


def _code(code: int | ReasonCode) -> int:
    return code.value if isinstance(code, ReasonCode) else code


def _payload(payload: Any) -> bytes:
    if isinstance(payload, bytes | bytearray):
        return bytes(payload)
    return b"" if payload is None else str(payload).encode()
