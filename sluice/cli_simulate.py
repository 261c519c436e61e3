"""``sluice simulate``: a fleet of temperature sensors sending over MQTT, TCP or Kafka (clients.devices).

The lectures' sensor workload: sensors ``sensor_<n>``; temperature starts at 65 + N(0,1)·20 °F and moves
by N(0,1)·5 every 100 ms. Device profiles (``--profile mix`` cycles through them):

    steady   a reading every 100 ms
    slow     a reading every second
    idle     three readings, then silence (the device goes idle)
    bursty   20 readings at once every 2 seconds

``--jump-every N`` makes every Nth reading of each sensor an injected jump (1.5× the previous absolute
temperature + 10, marked ``"jump": true``) so alerting can be checked deterministically. ``--duration 0``
runs until SIGINT/SIGTERM (containers). ``--transport kafka`` produces straight to a topic (Sluice's
Kafka listener or a Kafka/Redpanda cluster), keyed by sensor.

Over TCP each connection asks the listener whether it acks (``TcpDevice(ack="auto")``): with
``tcp.ack = true`` a reading is resent only when its ACK does not come; without acks (the default
listener) nothing is ever resent, so no reading is written twice. ``--no-ack`` skips the question.

A secured Sluice (``security.auth = "required"``, TLS): the login comes from the environment, never flags —
``SLUICE_USER``/``SLUICE_PASSWORD`` (MQTT CONNECT, the TCP AUTH line, Kafka SASL) and ``SLUICE_TLS_CA`` (TLS,
trusting that CA; MQTT then defaults to port 8883), see ``clients/security.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.table import Table

from clients.devices import BufferedDevice, TcpDevice
from clients.security import ClientSecurity
from sluice.cli_common import (
    DEFAULT_BOOTSTRAP,
    EXIT_RUNTIME,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Bootstrap,
    JsonFlag,
    console,
    err_console,
    fail,
    plural,
    print_json,
)
from sluice.cli_progress import Activity

__all__ = ["PROFILES", "TRANSPORTS", "Sensor", "register"]

PROFILES = ("steady", "slow", "idle", "bursty")
TRANSPORTS = ("mqtt", "tcp", "kafka")
DEFAULT_PORTS = {"mqtt": 1883, "tcp": 8094}
STEP_S = 0.1


@dataclass
class Sensor:
    name: str
    profile: str
    rng: random.Random
    jump_every: int = 0  # every Nth reading is an injected jump (0: never)
    temp: float = 0.0
    sent: int = 0
    jumps: int = 0

    def __post_init__(self) -> None:
        self.temp = 65 + self.rng.gauss(0, 1) * 20

    def reading(self) -> dict[str, Any]:
        jump = self.jump_every > 0 and (self.sent + 1) % self.jump_every == 0
        if jump:
            self.temp = abs(self.temp) * 1.5 + 10
            self.jumps += 1
        else:
            self.temp += self.rng.gauss(0, 1) * 5
        value: dict[str, Any] = {
            "device_id": self.name, "sensor": self.name, "temp": round(self.temp, 3), "ts": int(time.time() * 1000)
        }
        if jump:
            value["jump"] = True
        return value


async def _drive(sensor: Sensor, device: BufferedDevice, deadline: float, stop: asyncio.Event) -> None:
    """Send readings by the sensor's profile until the deadline (or ``stop``)."""
    step = 0
    while time.monotonic() < deadline and not stop.is_set():
        if sensor.profile == "steady":
            batch = 1
        elif sensor.profile == "slow":
            batch = 1 if step % 10 == 0 else 0
        elif sensor.profile == "idle":
            batch = 1 if step < 3 else 0
        else:  # bursty
            batch = 20 if step % 20 == 0 else 0
        for _ in range(batch):
            await device.send(sensor.reading())
            sensor.sent += 1
        step += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), STEP_S)


def simulate(
    transport: Annotated[str, typer.Option("--transport", "-t", help="mqtt, tcp or kafka.")] = "mqtt",
    host: Annotated[str, typer.Option(help="Sluice (or MQTT broker) host.")] = "127.0.0.1",
    port: Annotated[int | None, typer.Option(help="MQTT (1883) or TCP (8094) port of Sluice.")] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    topic: Annotated[str, typer.Option(help="Kafka topic the readings go to (--transport kafka).")] = "sensors",
    sensors: Annotated[int, typer.Option("--sensors", "-n", min=1, help="How many sensors.")] = 10,
    first_id: Annotated[int, typer.Option(min=0, help="Number of the first sensor (sensor_<n>).")] = 0,
    duration: Annotated[
        float, typer.Option("--duration", "-d", min=0, help="Seconds to run (0: until SIGINT/SIGTERM).")
    ] = 10.0,
    profile: Annotated[str, typer.Option(help="mix, steady, slow, idle or bursty.")] = "mix",
    jump_every: Annotated[
        int, typer.Option(min=0, help="Make every Nth reading of a sensor a jump (alert test; 0: never).")
    ] = 0,
    topic_prefix: Annotated[str, typer.Option(help="MQTT topic prefix (sensors/<name>).")] = "sensors",
    ack: Annotated[
        bool, typer.Option(help="Wait for durable acks: MQTT QoS 1; TCP when the listener acks (asked per connection).")
    ] = True,
    seed: Annotated[int | None, typer.Option(help="Random seed for reproducible readings.")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Simulate a sensor fleet sending temperature readings to Sluice over MQTT, TCP or Kafka."""
    if transport not in TRANSPORTS:
        fail(f"--transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}", EXIT_USAGE)
    if profile != "mix" and profile not in PROFILES:
        fail(f"--profile must be mix or one of {', '.join(PROFILES)}, got {profile!r}", EXIT_USAGE)
    try:
        security = ClientSecurity.from_env()  # SLUICE_USER/SLUICE_PASSWORD, SLUICE_TLS_CA (clients/security.py)
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    tls = security.ssl_context()
    if port is None:
        port = 8883 if transport == "mqtt" and tls is not None else DEFAULT_PORTS.get(transport, 0)
    address = bootstrap if transport == "kafka" else f"{host}:{port}"
    rng = random.Random(seed)
    fleet = [
        Sensor(
            f"sensor_{first_id + i}",
            PROFILES[i % len(PROFILES)] if profile == "mix" else profile,
            random.Random(rng.random()),
            jump_every,
        )
        for i in range(sensors)
    ]
    producer: Any = None

    def device_for(sensor: Sensor) -> BufferedDevice:
        if transport == "tcp":
            return TcpDevice(host, port, ack="auto" if ack else False, name=sensor.name, backoff_max=1.0,
                             username=security.username, password=security.password, tls_context=tls)
        if transport == "kafka":
            from clients.devices.kafka import KafkaDevice

            return KafkaDevice(producer, topic, name=sensor.name, backoff_max=1.0)
        from clients.devices.mqtt import MqttDevice

        return MqttDevice(
            host,
            port,
            topic=f"{topic_prefix}/{sensor.name}",
            client_id=sensor.name,
            ack=ack,
            name=sensor.name,
            backoff_max=1.0,
            username=security.username,
            password=security.password,
            tls_context=tls,
        )

    async def go() -> list[BufferedDevice]:
        nonlocal producer
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        if transport == "kafka":
            from clients import AsyncProducer
            from clients.errors import ClientError

            producer = AsyncProducer(bootstrap, value_serializer="raw", client_id="sluice-simulate")
            try:
                await producer.start()
            except ClientError as exc:
                fail(f"cannot reach {bootstrap} over the Kafka protocol ({exc}): pass --bootstrap", EXIT_UNREACHABLE)
        devices = [device_for(s) for s in fleet]
        for d in devices:
            await d.start()
        started = time.monotonic()
        deadline = started + duration if duration > 0 else float("inf")
        detail = f"over {transport}, {duration:g} s" if duration > 0 else f"over {transport}, until stopped"
        with Activity("simulating", "reading", detail=detail) as progress:
            drivers = asyncio.gather(*(_drive(s, d, deadline, stop) for s, d in zip(fleet, devices, strict=True)))
            while not drivers.done():
                await asyncio.wait([drivers], timeout=0.2)
                progress.set(sum(s.sent for s in fleet))
            await drivers
        for d in devices:
            # A device still connecting (the TCP ack probe waits up to 2 s for an answer) delivers within
            # the wait; only one whose connects all failed has nothing to wait for.
            reachable = d.stats.connects > 0 or d.stats.last_error is None
            await d.close(timeout=5 if reachable else 0.5)
        if producer is not None:
            await producer.stop()
        return devices

    try:
        devices = asyncio.run(go())
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    rows: list[dict[str, Any]] = [
        {
            "sensor": s.name,
            "profile": s.profile,
            "sent": s.sent,
            "jumps": s.jumps,
            "delivered": d.stats.sent,
            "undelivered": d.stats.queued,
            "connects": d.stats.connects,
        }
        for s, d in zip(fleet, devices, strict=True)
    ]
    undelivered = sum(r["undelivered"] for r in rows)
    report: dict[str, Any] = {"transport": transport, "address": address, "sensors": rows}
    tcp_devices = [d for d in devices if isinstance(d, TcpDevice)]
    if tcp_devices:
        modes = {d.acking for d in tcp_devices if d.acking is not None}
        report["tcp_acks"] = modes.pop() if len(modes) == 1 else None  # None: never connected (or mixed)
        report["unconfirmed"] = sum(d.unconfirmed for d in tcp_devices)
    if json_out:
        print_json(report)
    else:
        table = Table("sensor", "profile", "sent", "delivered", "undelivered")
        for r in rows:
            table.add_row(r["sensor"], r["profile"], str(r["sent"]), str(r["delivered"]), str(r["undelivered"]))
        console.print(table)
        if tcp_devices and report["tcp_acks"] is not None:
            how = "acknowledged each batch" if report["tcp_acks"] else "does not acknowledge (each reading sent once)"
            err_console.print(f"The TCP listener at {address} {how}.")
        if tcp_devices and report["unconfirmed"]:
            err_console.print(f"{plural(report['unconfirmed'], 'reading')} written on a connection that broke; "
                              "without acks they are not resent and may be missing.")
    if undelivered:
        never = all(d.stats.connects == 0 for d in devices)
        what = {"mqtt": "MQTT", "tcp": "TCP", "kafka": "Kafka"}[transport]
        fix = "pass --bootstrap" if transport == "kafka" else "pass --port"
        fail(
            f"{plural(undelivered, 'reading')} not delivered to {address}: is Sluice's {what} listener there? {fix}",
            EXIT_UNREACHABLE if never else EXIT_RUNTIME,
        )


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
