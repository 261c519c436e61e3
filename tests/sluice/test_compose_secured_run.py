"""The compose stack's security, run as local processes (no Docker engine here): its `certs` and `users`
one-shot commands as written, `sluice serve` with the `sluice` service's own environment (only paths and
ports changed), its healthcheck over HTTPS, a simulator over MQTT/TLS with the stack's client login, and the
processor service joining its consumer group over SASL_SSL — the processor's own healthcheck."""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.sluice_server import SluiceProcess

ROOT = Path(__file__).resolve().parents[2]


def _service(name: str) -> dict[str, Any]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = compose["services"][name]
    assert isinstance(service, dict)
    return service


def _env(service: dict[str, Any]) -> dict[str, str]:
    """The service's environment as compose gives it (``${VAR:-default}`` with VAR unset: the default)."""
    return {str(k): re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(v))
            for k, v in (service.get("environment") or {}).items()}


def _rewrite(value: str, tls_root: Path, data: Path) -> str:
    """A container path of the two volumes (``/tls...``, ``/data...``) as a local one."""
    for mount, local in (("/tls", tls_root), ("/data", data)):
        if value == mount or value.startswith(mount + "/"):
            return str(local) + value[len(mount):]
    return value


def sluice(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**full_env, "PYTHONPATH": str(ROOT), **(env or {})}, check=False)


@pytest.mark.slow
def test_the_compose_stack_logs_in_over_tls(tmp_path: Path) -> None:
    tls_root, data = tmp_path / "tls-volume", tmp_path / "data-volume"
    default_password = "sluice-dev-only"  # compose's ${SLUICE_ADMIN_PASSWORD:-...} default
    # certs: made on the first start, kept on the next
    certs_cmd = [_rewrite(a, tls_root, data) for a in _service("certs")["command"]]
    assert sluice(*certs_cmd).returncode == 0
    first = (tls_root / "tls" / "server.pem").read_bytes()
    again = sluice(*certs_cmd)
    assert again.returncode == 0 and "keeping" in again.stdout
    assert (tls_root / "tls" / "server.pem").read_bytes() == first
    # users: the first user from the environment (ADMIN_PASSWORD <- SLUICE_ADMIN_PASSWORD)
    users = _service("users")
    added = sluice(*[_rewrite(a, tls_root, data) for a in users["command"]], env={"ADMIN_PASSWORD": default_password})
    assert added.returncode == 0, added.stderr
    # sluice: the service's environment, with volume paths and ports made local (no Mosquitto to bridge)
    env = {k: _rewrite(v, tls_root, data) for k, v in _env(_service("sluice")).items()
           if not k.endswith("__PORT") and k not in ("SLUICE_MQTT__BRIDGES", "SLUICE_DATA_DIR")}
    env["SLUICE_MQTT__TLS_PORT"] = "0"
    extra = json.loads(env["SLUICE_KAFKA__EXTRA_LISTENERS"])
    env["SLUICE_KAFKA__EXTRA_LISTENERS"] = json.dumps([{**x, "port": 0, "advertised_host": "localhost",
                                                         "advertised_port": None} for x in extra])
    assert env["SLUICE_KAFKA__ADVERTISED_HOST"] == "localhost"  # kept: a listener on 0.0.0.0 needs one
    env.pop("SLUICE_KAFKA__ADVERTISED_PORT")  # the bound port, not the compose stack's
    server = SluiceProcess(data, env=env).start()
    try:
        assert server.endpoints["kafka"]["host"] == "0.0.0.0" and "mqtt" not in server.endpoints  # TLS only
        ca = ssl.create_default_context(cafile=str(tls_root / "tls" / "ca.pem"))
        with urllib.request.urlopen(f"https://localhost:{server.endpoints['http']['port']}/ready", timeout=10,
                                    context=ca) as ready:  # the service's healthcheck
            assert ready.status == 200
        login = {k: _rewrite(v, tls_root, data) for k, v in _env(_service("simulator")).items()}
        assert login["SLUICE_PASSWORD"] == default_password
        sim = sluice("simulate", "--transport", "mqtt", "--host", "localhost", "--port",
                     str(server.endpoints["mqtt-tls"]["port"]), "--sensors", "2", "--duration", "1", "--json",
                     env=login)
        assert sim.returncode == 0, sim.stderr
        assert all(row["delivered"] > 0 for row in json.loads(sim.stdout)["sensors"])
        # the processor service joins its group over SASL_SSL (its healthcheck: `sluice groups describe`)
        bootstrap = f"localhost:{server.endpoints['kafka:internal']['port']}"
        processor_env = {k: _rewrite(v, tls_root, data) for k, v in _env(_service("processor")).items()}
        command = [_rewrite(a, tls_root, data) for a in _service("processor")["command"]]
        command[command.index("--bootstrap") + 1] = bootstrap
        proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", *command], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True,
                                env={**{k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")},
                                     "PYTHONPATH": str(ROOT), **processor_env})
        try:
            deadline = time.monotonic() + 60
            while True:
                check = sluice("groups", "describe", "sensor-avg", "--bootstrap", bootstrap, "--json",
                               env=processor_env)
                if check.returncode == 0 and json.loads(check.stdout)["members"]:
                    break
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, check.stderr
                time.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    finally:
        server.stop()
