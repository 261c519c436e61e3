"""``sluice demo``: the docker-compose stack as local processes on loopback, for machines without Docker.

What runs (each a child process with its log under ``<data-dir>/logs/``), started in this order and
stopped in reverse on Ctrl-C, SIGTERM or when ``--duration`` is over:

    mosquitto      a real Mosquitto on a free loopback port (the "site broker"; skipped, with a
                   warning, when the binary is missing)
    sluice         ``sluice serve``: Kafka, MQTT, TCP (ack mode) and HTTP, routing every reading into
                   topic ``sensors`` (keyed by sensor, event time from ``ts``), bridging Mosquitto
    sim-mqtt       ``sluice simulate`` over MQTT to Sluice          (sensor_0 …)
    sim-bridge     ``sluice simulate`` over MQTT to Mosquitto       (sensor_100 …, reaches Sluice via the bridge)
    sim-tcp        ``sluice simulate`` over TCP to Sluice           (sensor_200 …)
    processor      ``sluice process processors.examples.sensors:pipeline`` standalone against Sluice's
                   Kafka port: 10 s means per sensor -> sensor-avg, late data -> sensor-late,
                   jumps -> sensor-alerts

Each simulator runs the ``mix`` profile (steady, slow, idle and bursty devices). Ports: the usual ones
(9092, 1883, 8094, 8080, Mosquitto 1884) when free, otherwise (or with ``--free-ports``) free ones.
``DemoStack`` is the launcher API the ``demo`` command and the end-to-end test share.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["PIPELINE", "SENSOR_ROUTES", "TOPICS", "DemoConfig", "DemoError", "DemoPorts", "DemoStack", "register"]

PIPELINE = "processors.examples.sensors:pipeline"
TOPICS = {"input": "sensors", "output": "sensor-avg", "late": "sensor-late", "alerts": "sensor-alerts"}
GROUP = "sensor-avg"
# The routing rules of docker-compose.yml's sluice service (tests/sluice/test_compose.py checks they agree).
SENSOR_ROUTES: list[dict[str, Any]] = [
    {"name": "sensors-mqtt", "filter": "sensors/+", "topic": "sensors", "key": "field:sensor",
     "format": "json", "time_field": "ts", "time_format": "epoch_ms"},
    {"name": "sensors-tcp", "source": "tcp", "topic": "sensors", "key": "field:sensor",
     "format": "json", "time_field": "ts", "time_format": "epoch_ms"},
]
SIMULATORS = (("sim-mqtt", "mqtt", 0), ("sim-bridge", "bridge", 100), ("sim-tcp", "tcp", 200))
_STOP_TIMEOUT_S = 20.0


class DemoError(Exception):
    """The demo stack could not start (a port, a binary, a child that died); the message says which."""


@dataclass(frozen=True)
class DemoConfig:
    data_dir: Path = Path("./demo-data")
    free_ports: bool = False
    sensors: int = 8  # per simulator
    jump_every: int = 50
    seed: int | None = None
    partitions: int = 3
    checkpoint_interval_s: float = 2.0
    mosquitto: bool = True  # False: no Mosquitto, no bridge, no sim-bridge


@dataclass(frozen=True)
class DemoPorts:
    kafka: int
    mqtt: int
    tcp: int
    http: int
    mosquitto: int | None


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port(taken: set[int]) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            return port


def pick_ports(free_only: bool, mosquitto: bool) -> DemoPorts:
    taken: set[int] = set()

    def pick(preferred: int) -> int:
        port = preferred if not free_only and preferred not in taken and _bindable(preferred) else _free_port(taken)
        taken.add(port)
        return port

    return DemoPorts(pick(9092), pick(1883), pick(8094), pick(8080), pick(1884) if mosquitto else None)


@dataclass
class DemoStack:
    config: DemoConfig
    ports: DemoPorts | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    stopped: set[str] = field(default_factory=set)

    @property
    def logs(self) -> Path:
        return self.config.data_dir / "logs"

    @property
    def bootstrap(self) -> str:
        assert self.ports is not None
        return f"127.0.0.1:{self.ports.kafka}"

    # -- start -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start everything; on failure stop what was started and raise DemoError."""
        cfg = self.config
        mosquitto_bin = shutil.which("mosquitto") or next(
            (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.access(p, os.X_OK)), None)
        use_mosquitto = cfg.mosquitto and mosquitto_bin is not None
        self.ports = ports = pick_ports(cfg.free_ports, use_mosquitto)
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            if use_mosquitto:
                assert mosquitto_bin is not None and ports.mosquitto is not None
                self._spawn("mosquitto", [mosquitto_bin, "-c", str(self._mosquitto_conf(ports.mosquitto))])
                self._wait_port("mosquitto", ports.mosquitto)
            self._spawn("sluice", self._sluice(["serve", "--data-dir", str(cfg.data_dir / "sluice")]),
                        env=self._serve_env(ports))
            self._wait_ready()
            for name, transport, first in SIMULATORS:
                if transport == "bridge" and not use_mosquitto:
                    continue
                self._spawn(name, self._sluice(self._simulate_args(transport, first)))
            self._spawn("processor", self._sluice(
                ["process", PIPELINE, "--bootstrap", self.bootstrap,
                 "--checkpoint-interval", str(cfg.checkpoint_interval_s)]),
                env={"SENSORS_INPUT": TOPICS["input"], "SENSORS_OUTPUT": TOPICS["output"],
                     "SENSORS_LATE": TOPICS["late"], "SENSORS_ALERTS": TOPICS["alerts"], "SENSORS_GROUP": GROUP})
        except BaseException:
            self.stop()
            raise

    def _sluice(self, args: list[str]) -> list[str]:
        return [sys.executable, "-m", "sluice.cli", *args]

    def _simulate_args(self, transport: str, first: int) -> list[str]:
        ports, cfg = self.ports, self.config
        assert ports is not None
        port = {"mqtt": ports.mqtt, "bridge": ports.mosquitto, "tcp": ports.tcp}[transport]
        args = ["simulate", "--transport", "tcp" if transport == "tcp" else "mqtt", "--host", "127.0.0.1",
                "--port", str(port), "--sensors", str(cfg.sensors), "--first-id", str(first), "--profile", "mix",
                "--jump-every", str(cfg.jump_every), "--duration", "0", "--json"]
        if cfg.seed is not None:
            args += ["--seed", str(cfg.seed + first)]
        return args

    def _serve_env(self, ports: DemoPorts) -> dict[str, str]:
        bridges = [] if ports.mosquitto is None else [
            {"name": "site", "host": "127.0.0.1", "port": ports.mosquitto, "topics": ["sensors/#"],
             "client_id": "sluice-bridge"}]
        return {
            "SLUICE_HOST": "127.0.0.1",
            "SLUICE_STORAGE__DEFAULT_PARTITIONS": str(self.config.partitions),
            "SLUICE_KAFKA__PORT": str(ports.kafka),
            "SLUICE_MQTT__PORT": str(ports.mqtt),
            "SLUICE_MQTT__BRIDGES": json.dumps(bridges),
            "SLUICE_TCP__PORT": str(ports.tcp),
            "SLUICE_TCP__ACK": "true",
            "SLUICE_HTTP__PORT": str(ports.http),
            "SLUICE_INGEST__ROUTES": json.dumps(SENSOR_ROUTES),
        }

    def _mosquitto_conf(self, port: int) -> Path:
        home = self.config.data_dir / "mosquitto"
        home.mkdir(parents=True, exist_ok=True)
        conf = home / "mosquitto.conf"
        conf.write_text(
            f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
            f"persistence_location {home.resolve()}/\nmax_queued_messages 200000\nlog_dest stdout\n"
            # As root Mosquitto would switch to user `mosquitto`, which cannot write our data dir.
            f"user {pwd.getpwuid(os.getuid()).pw_name}\n"
        )
        return conf

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "SENSORS_"))}
        with (self.logs / f"{name}.log").open("ab") as log:
            # A session of its own: Ctrl-C reaches only the demo, which stops the children in order.
            self.procs[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env={**base, **(env or {})}, start_new_session=True)

    def _wait_port(self, name: str, port: int, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive(name)
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
            if time.monotonic() > deadline:
                raise DemoError(f"{name} did not listen on 127.0.0.1:{port}; see {self.logs / (name + '.log')}")
            time.sleep(0.05)

    def _wait_ready(self, timeout: float = 30.0) -> None:
        assert self.ports is not None
        url = f"http://127.0.0.1:{self.ports.http}/ready"
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive("sluice")
            with contextlib.suppress(OSError, urllib.error.URLError), urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
            if time.monotonic() > deadline:
                raise DemoError(f"sluice was not ready within {timeout:.0f} s; see {self.logs / 'sluice.log'}")
            time.sleep(0.1)

    def _check_alive(self, name: str) -> None:
        code = self.procs[name].poll()
        if code is not None:
            tail = (self.logs / f"{name}.log").read_text(errors="replace")[-2000:]
            raise DemoError(f"{name} exited with code {code}:\n{tail}")

    # -- run and stop ----------------------------------------------------------------------

    def failed(self) -> str | None:
        """The first child that exited although nobody stopped it, as 'name (exit code)'."""
        for name, proc in self.procs.items():
            code = proc.poll()
            if name not in self.stopped and code is not None:
                return f"{name} (exit code {code})"
        return None

    def stop_one(self, name: str) -> int | None:
        proc = self.procs.get(name)
        if proc is None:
            return None
        self.stopped.add(name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def stop_simulators(self) -> None:
        for name, _transport, _first in SIMULATORS:
            self.stop_one(name)

    def stop(self) -> dict[str, int | None]:
        """Stop every child in reverse start order; returns their exit codes."""
        return {name: self.stop_one(name) for name in reversed(list(self.procs))}

    # -- what to tell the user --------------------------------------------------------------

    def where_to_look(self) -> str:
        p = self.ports
        assert p is not None
        b = self.bootstrap
        lines = [
            f"Sluice demo running — data and logs in {self.config.data_dir} (logs/<service>.log)",
            f"  Kafka     {b}",
            f"  MQTT      127.0.0.1:{p.mqtt}",
            f"  TCP       127.0.0.1:{p.tcp}  (NDJSON, ack mode)",
            f"  HTTP      http://127.0.0.1:{p.http}  (OpenAPI docs at /docs)",
        ]
        if p.mosquitto is not None:
            lines.append(f"  Mosquitto 127.0.0.1:{p.mosquitto}  (bridged into Sluice: sensors/#)")
        lines += [
            "Simulators: " + ", ".join(n for n in self.procs if n.startswith("sim-")) + f"; processor group {GROUP}",
            "Look:",
            f"  kcat -b {b} -C -t {TOPICS['output']} -o beginning -f '%k %s\\n'     # 10 s means per sensor",
            f"  kcat -b {b} -C -t {TOPICS['alerts']} -o beginning                  # jump alerts",
            f"  curl -N http://127.0.0.1:{p.http}/topics/{TOPICS['output']}/stream    # the same over SSE",
            f"  curl -s http://127.0.0.1:{p.http}/sources                            # devices, rates, idle",
            f"  curl -s http://127.0.0.1:{p.http}/groups/{GROUP}                     # processor lag",
            f"  mosquitto_pub -h 127.0.0.1 -p {p.mqtt} -q 1 -t sensors/sensor_999 "
            f"-m \"{{\\\"sensor\\\":\\\"sensor_999\\\",\\\"temp\\\":70.5,\\\"ts\\\":$(date +%s%3N)}}\"",
            f"  echo \"{{\\\"sensor\\\":\\\"sensor_998\\\",\\\"temp\\\":70.5,\\\"ts\\\":$(date +%s%3N)}}\" "
            f"| nc -q 1 127.0.0.1 {p.tcp}",
            "Ctrl-C stops everything.",
        ]
        return "\n".join(lines)


def demo(
    data_dir: Annotated[Path, typer.Option(help="Where the demo keeps its data and logs.")] = Path("./demo-data"),
    duration: Annotated[float, typer.Option(min=0, help="Stop after this many seconds (0: run until Ctrl-C).")] = 0.0,
    free_ports: Annotated[bool, typer.Option(help="Always use free ports, even when the usual ones are free.")] = False,
    sensors: Annotated[int, typer.Option(min=1, help="Sensors per simulator.")] = 8,
    jump_every: Annotated[int, typer.Option(min=0, help="Every Nth reading of a sensor is a jump (0: none).")] = 50,
    seed: Annotated[int | None, typer.Option(help="Random seed for the simulators.")] = None,
    mosquitto: Annotated[bool, typer.Option(help="Run Mosquitto and the bridge (needs the mosquitto binary).")] = True,
) -> None:
    """Run the docker-compose stack as local processes: Sluice, Mosquitto + bridge, simulators, processor."""
    stack = DemoStack(DemoConfig(data_dir=data_dir, free_ports=free_ports, sensors=sensors, jump_every=jump_every,
                                 seed=seed, mosquitto=mosquitto))
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            stack.start()
        except DemoError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        if mosquitto and stack.ports is not None and stack.ports.mosquitto is None:
            typer.echo("warning: no mosquitto binary found: running without Mosquitto and the bridge", err=True)
        typer.echo(stack.where_to_look(), nl=True)
        deadline = time.monotonic() + duration if duration > 0 else float("inf")
        failed = None
        while not stop.wait(0.25) and time.monotonic() < deadline:
            failed = stack.failed()
            if failed:
                break
        typer.echo("stopping…", err=True)
        codes = stack.stop()
        bad = {n: c for n, c in codes.items() if c not in (0, None, -signal.SIGTERM)}
        if failed or bad:
            typer.echo(f"error: {failed or bad}; see the logs in {stack.logs}", err=True)
            raise typer.Exit(1)
        typer.echo("stopped cleanly", err=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
