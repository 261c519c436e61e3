"""``sluice simulate``: a fleet of temperature sensors sending over MQTT or TCP (clients.devices).

The lectures' sensor workload: sensors ``sensor_<n>``; temperature starts at 65 + N(0,1)·20 °F and moves
by N(0,1)·5 every 100 ms. Device profiles (``--profile mix`` cycles through them):

    steady   a reading every 100 ms
    slow     a reading every second
    idle     three readings, then silence (the device goes idle)
    bursty   20 readings at once every 2 seconds
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from clients.devices import BufferedDevice, TcpDevice
from sluice.cli_common import (
    EXIT_RUNTIME,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    JsonFlag,
    console,
    err_console,
    fail,
    print_json,
)

__all__ = ["PROFILES", "Sensor", "register"]

PROFILES = ("steady", "slow", "idle", "bursty")
STEP_S = 0.1


@dataclass
class Sensor:
    name: str
    profile: str
    rng: random.Random
    temp: float = 0.0
    sent: int = 0

    def __post_init__(self) -> None:
        self.temp = 65 + self.rng.gauss(0, 1) * 20

    def reading(self) -> dict[str, Any]:
        self.temp += self.rng.gauss(0, 1) * 5
        return {"device_id": self.name, "sensor": self.name, "temp": round(self.temp, 3), "ts": int(time.time() * 1000)}


async def _drive(sensor: Sensor, device: BufferedDevice, deadline: float) -> None:
    """Send readings by the sensor's profile until the deadline."""
    step = 0
    while time.monotonic() < deadline:
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
        await asyncio.sleep(STEP_S)


def simulate(
    transport: Annotated[str, typer.Option("--transport", "-t", help="mqtt or tcp.")] = "mqtt",
    host: Annotated[str, typer.Option(help="Sluice host.")] = "127.0.0.1",
    port: Annotated[int | None, typer.Option(help="MQTT (1883) or TCP (8094) port of Sluice.")] = None,
    sensors: Annotated[int, typer.Option("--sensors", "-n", min=1, help="How many sensors.")] = 10,
    duration: Annotated[float, typer.Option("--duration", "-d", min=0.1, help="Seconds to run.")] = 10.0,
    profile: Annotated[str, typer.Option(help="mix, steady, slow, idle or bursty.")] = "mix",
    topic_prefix: Annotated[str, typer.Option(help="MQTT topic prefix (sensors/<name>).")] = "sensors",
    ack: Annotated[bool, typer.Option(help="Wait for durable acks (MQTT QoS 1 / TCP ack mode).")] = True,
    seed: Annotated[int | None, typer.Option(help="Random seed for reproducible readings.")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Simulate a sensor fleet sending temperature readings to Sluice over MQTT or TCP."""
    if transport not in ("mqtt", "tcp"):
        fail(f"--transport must be mqtt or tcp, got {transport!r}", EXIT_USAGE)
    if profile != "mix" and profile not in PROFILES:
        fail(f"--profile must be mix or one of {', '.join(PROFILES)}, got {profile!r}", EXIT_USAGE)
    port = port if port is not None else (1883 if transport == "mqtt" else 8094)
    rng = random.Random(seed)
    fleet = [
        Sensor(f"sensor_{i}", PROFILES[i % len(PROFILES)] if profile == "mix" else profile, random.Random(rng.random()))
        for i in range(sensors)
    ]

    def device_for(sensor: Sensor) -> BufferedDevice:
        if transport == "tcp":
            return TcpDevice(host, port, ack=ack, name=sensor.name, backoff_max=1.0)
        from clients.devices.mqtt import MqttDevice

        return MqttDevice(
            host,
            port,
            topic=f"{topic_prefix}/{sensor.name}",
            client_id=sensor.name,
            ack=ack,
            name=sensor.name,
            backoff_max=1.0,
        )

    async def go() -> list[BufferedDevice]:
        devices = [device_for(s) for s in fleet]
        for d in devices:
            await d.start()
        started = time.monotonic()
        deadline = started + duration
        show = sys.stderr.isatty() and not json_out
        with Progress(
            TextColumn("simulating"),
            BarColumn(),
            TextColumn("{task.fields[sent]} readings"),
            TimeRemainingColumn(),
            console=err_console,
            disable=not show,
            transient=True,
        ) as progress:
            task = progress.add_task("simulate", total=duration, sent=0)
            drivers = asyncio.gather(*(_drive(s, d, deadline) for s, d in zip(fleet, devices, strict=True)))
            while not drivers.done():
                await asyncio.sleep(0.2)
                progress.update(
                    task, completed=min(time.monotonic() - started, duration), sent=sum(s.sent for s in fleet)
                )
            await drivers
        for d in devices:
            await d.close(timeout=5 if d.stats.connects else 0.5)  # nothing to wait for if never connected
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
            "delivered": d.stats.sent,
            "undelivered": d.stats.queued,
            "connects": d.stats.connects,
        }
        for s, d in zip(fleet, devices, strict=True)
    ]
    undelivered = sum(r["undelivered"] for r in rows)
    if json_out:
        print_json({"transport": transport, "address": f"{host}:{port}", "sensors": rows})
    else:
        table = Table("sensor", "profile", "sent", "delivered", "undelivered")
        for r in rows:
            table.add_row(r["sensor"], r["profile"], str(r["sent"]), str(r["delivered"]), str(r["undelivered"]))
        console.print(table)
    if undelivered:
        never = all(d.stats.connects == 0 for d in devices)
        what = "MQTT" if transport == "mqtt" else "TCP"
        fail(
            f"{undelivered} readings were not delivered to {host}:{port}: is Sluice's {what} listener there? "
            f"pass --port",
            EXIT_UNREACHABLE if never else EXIT_RUNTIME,
        )


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)
