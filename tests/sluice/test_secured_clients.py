"""Sluice's own clients against a secured broker (auth required + TLS on every listener), logging in from the
environment (``clients/security.py``: SLUICE_USER, SLUICE_PASSWORD, SLUICE_TLS_CA): ``sluice simulate`` over
MQTT (port 8883, TLS) and TCP (TLS + AUTH line), and the client library's producer and consumer over
SASL_SSL — what the compose stack's services do."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.security import UserStore
from clients import AsyncConsumer, AsyncProducer, ClientSecurity
from sluice.dev_certs import DevCertificates
from tests.sluice_server import SluiceProcess
from tests.tls_certs import make_certs, tls_env

pytestmark = pytest.mark.slow  # every test starts sluice serve with TLS and runs the CLI as subprocesses

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return make_certs(tmp_path_factory.mktemp("secured") / "tls")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, certs: DevCertificates) -> Iterator[SluiceProcess]:
    data = tmp_path_factory.mktemp("secured-serve") / "data"
    UserStore(data).add("sensor-fleet", "fleet pw")
    proc = SluiceProcess(data, env={**tls_env(certs), "SLUICE_SECURITY__AUTH": "required",
                                    "SLUICE_SECURITY__SUPER_USERS": '["sensor-fleet"]',
                                    "SLUICE_MQTT__TLS_PORT": "0", "SLUICE_TCP__ACK": "true"}).start()
    yield proc
    proc.stop()


def client_env(certs: DevCertificates, password: str = "fleet pw") -> dict[str, str]:
    return {"SLUICE_USER": "sensor-fleet", "SLUICE_PASSWORD": password, "SLUICE_TLS_CA": str(certs.ca)}


def simulate(server: SluiceProcess, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "simulate", "--host", "localhost", "--sensors", "2",
         "--profile", "steady", "--duration", "1", "--json", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env}, capture_output=True, text=True, timeout=90, check=False)


@pytest.mark.parametrize(("transport", "endpoint"), [("mqtt", "mqtt-tls"), ("tcp", "tcp")])
def test_simulate_logs_in_over_tls(server: SluiceProcess, certs: DevCertificates, transport: str,
                                   endpoint: str) -> None:
    port = str(server.endpoints[endpoint]["port"])
    good = simulate(server, client_env(certs), "--transport", transport, "--port", port)
    assert good.returncode == 0, good.stderr
    rows = json.loads(good.stdout)["sensors"]
    assert all(r["delivered"] > 0 and r["undelivered"] == 0 for r in rows), rows
    bad = simulate(server, client_env(certs, "wrong"), "--transport", transport, "--port", port)
    assert bad.returncode != 0


async def _round_trip(bootstrap: str, security: ClientSecurity) -> list[object]:
    async with AsyncProducer(bootstrap, security=security) as producer:
        await producer.send("secured", {"n": 1}, key="k")
    async with AsyncConsumer("secured", bootstrap=bootstrap, group_id="secured-readers") as consumer:
        record = await consumer.getone(timeout_ms=15_000)
        return [record.value] if record is not None else []


def test_client_library_over_sasl_ssl(server: SluiceProcess, certs: DevCertificates,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in client_env(certs).items():
        monkeypatch.setenv(name, value)  # the consumer reads the environment, the producer takes it as an argument
    security = ClientSecurity.from_env()
    assert security.kafka_options()["security_protocol"] == "SASL_SSL"
    bootstrap = f"localhost:{server.endpoints['kafka']['port']}"
    assert asyncio.run(_round_trip(bootstrap, security)) == [{"n": 1}]


def test_users_cli_over_https_trusts_the_dev_ca(server: SluiceProcess, certs: DevCertificates) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **client_env(certs),
           "SLUICE_HTTP": f"https://localhost:{server.endpoints['http']['port']}"}
    env.pop("SLUICE_DATA_DIR", None)
    added = subprocess.run([sys.executable, "-m", "sluice.cli", "users", "add", "field-tech", "--json"],
                           input="tech pw\n", env=env, capture_output=True, text=True, timeout=60, check=False)
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout) == {"user": "field-tech", "created": True}
    untrusted = subprocess.run([sys.executable, "-m", "sluice.cli", "users", "list"],
                               env={**env, "SLUICE_TLS_CA": ""}, capture_output=True, text=True, timeout=60,
                               check=False)
    assert untrusted.returncode != 0  # the dev CA is not in the system's trust store
