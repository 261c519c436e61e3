"""An unauthenticated broker never opens to the network by accident: with ``security.auth = "off"`` a listener
bound beyond loopback refuses to start, unless ``security.allow_insecure = true`` (then a WARNING)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.security import UserStore
from sluice.config import KafkaListenerSettings, KafkaSettings, MqttSettings, SecuritySettings, Settings
from sluice.exposure import UnroutableAdvertisedHostError, check_advertised_hosts, exposed_listeners, is_loopback
from tests.sluice_server import SluiceProcess


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("192.168.1.10", False), ("no-such-host.invalid", False),
])
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_exposed_listeners_name_each_enabled_listener_beyond_loopback() -> None:
    assert exposed_listeners(Settings()) == []
    settings = Settings(host="0.0.0.0", mqtt=MqttSettings(enabled=False), kafka=KafkaSettings(extra_listeners=[
        KafkaListenerSettings(name="local", port=0, host="127.0.0.1"),
        KafkaListenerSettings(name="lan", port=0, host="10.0.0.5")]))
    assert exposed_listeners(settings) == ["kafka on 0.0.0.0", "kafka:lan on 10.0.0.5", "tcp on 0.0.0.0",
                                           "http on 0.0.0.0"]
    only_extra = Settings(kafka=KafkaSettings(extra_listeners=[KafkaListenerSettings(name="lan", port=0,
                                                                                     host="0.0.0.0")]))
    assert exposed_listeners(only_extra) == ["kafka:lan on 0.0.0.0"]
    assert exposed_listeners(Settings(host="0.0.0.0", security=SecuritySettings(auth="required"))) == []


def _serve(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "serve", "--data-dir", str(tmp_path / "data"), "--host", "0.0.0.0"],
        env={**os.environ, "SLUICE_KAFKA__PORT": "0", "SLUICE_MQTT__PORT": "0", "SLUICE_TCP__PORT": "0",
             "SLUICE_HTTP__PORT": "0", **env},
        capture_output=True, text=True, timeout=60, check=False)


def test_serve_on_every_interface_without_auth_refuses_to_start(tmp_path: Path) -> None:
    refused = _serve(tmp_path)
    assert refused.returncode != 0
    assert "refusing to start: security.auth = off" in refused.stderr
    assert "kafka on 0.0.0.0" in refused.stderr and "allow_insecure" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "data" / "endpoints.json").exists()  # nothing was opened


def test_allow_insecure_starts_with_a_warning(tmp_path: Path) -> None:
    server = SluiceProcess(tmp_path / "data", env={"SLUICE_SECURITY__ALLOW_INSECURE": "true",
                                                   "SLUICE_KAFKA__ADVERTISED_HOST": "localhost"},
                           args=["--host", "0.0.0.0"]).start()
    try:
        log = server.log.read_text()
        assert "WARNING" in log and "security.allow_insecure = true allows it" in log
    finally:
        server.stop()


def test_auth_required_starts_on_every_interface_without_warning(tmp_path: Path) -> None:
    UserStore(tmp_path / "data").add("alice", "pw")
    server = SluiceProcess(tmp_path / "data", env={"SLUICE_SECURITY__AUTH": "required",
                                                   "SLUICE_KAFKA__ADVERTISED_HOST": "localhost"},
                           args=["--host", "0.0.0.0"]).start()
    try:
        assert "allow_insecure" not in server.log.read_text()
    finally:
        server.stop()


def test_a_kafka_listener_on_every_interface_needs_an_advertised_host() -> None:
    """Kafka's rule (advertised.listeners cannot use 0.0.0.0): clients elsewhere would be sent to 0.0.0.0."""
    with pytest.raises(UnroutableAdvertisedHostError, match=r"kafka binds 0\.0\.0\.0: set kafka\.advertised_host"):
        check_advertised_hosts(Settings(host="0.0.0.0"))
    with pytest.raises(UnroutableAdvertisedHostError, match="kafka:lan binds ::"):
        check_advertised_hosts(Settings(kafka=KafkaSettings(extra_listeners=[
            KafkaListenerSettings(name="lan", port=0, host="::")])))
    check_advertised_hosts(Settings())  # loopback
    check_advertised_hosts(Settings(host="0.0.0.0", kafka=KafkaSettings(advertised_host="broker.example")))
    check_advertised_hosts(Settings(host="0.0.0.0", kafka=KafkaSettings(enabled=False)))
    check_advertised_hosts(Settings(host="10.0.0.5"))  # a routable bind address is what it advertises


def test_serve_on_every_interface_without_an_advertised_host_refuses_in_one_line(tmp_path: Path) -> None:
    """docs/security.md's quick setup binds 0.0.0.0 with auth on: before, Metadata told remote clients to
    connect to 0.0.0.0:9092."""
    UserStore(tmp_path / "data").add("alice", "pw")
    refused = _serve(tmp_path, SLUICE_SECURITY__AUTH="required")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "Traceback" not in refused.stderr
    assert "SLUICE_KAFKA__ADVERTISED_HOST" in refused.stderr and "kafka binds 0.0.0.0" in refused.stderr
    assert not (tmp_path / "data" / "endpoints.json").exists()
