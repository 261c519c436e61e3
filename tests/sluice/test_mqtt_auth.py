"""``security.auth = "required"`` on MQTT: mosquitto_pub and paho log in against the user store of a real
``sluice serve``; a bad password gets 0x86 (5.0) / 0x04 (3.1.1), no credentials are refused too."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.request
from collections.abc import Iterator

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from broker.security import UserStore
from tests.sluice_server import SluiceProcess


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    data = tmp_path_factory.mktemp("mqtt-auth") / "data"
    UserStore(data).add("meter", "s3cret")
    # mqtt.users must not open a back door once the user store is in charge
    proc = SluiceProcess(data, env={"SLUICE_SECURITY__AUTH": "required", "SLUICE_SECURITY__OPEN_METRICS": "true",
                                    "SLUICE_SECURITY__SUPER_USERS": '["meter"]',
                                    "SLUICE_MQTT__USERS": '{"legacy": "plain-text"}'})
    proc.start()
    yield proc
    proc.stop()


def mosquitto_pub(server: SluiceProcess, version: str, *creds: str) -> subprocess.CompletedProcess[str]:
    port = str(server.endpoints["mqtt"]["port"])
    return subprocess.run(["mosquitto_pub", "-p", port, "-V", version, *creds, "-q", "1", "-t", "meters/1",
                           "-m", "42"], capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_pub_good_bad_and_no_credentials(server: SluiceProcess, version: str) -> None:
    good = mosquitto_pub(server, version, "-u", "meter", "-P", "s3cret")
    assert good.returncode == 0, good.stderr
    refused = (["-u", "meter", "-P", "wrong"], ["-u", "nobody", "-P", "s3cret"], ["-u", "legacy", "-P", "plain-text"])
    for creds in refused:
        bad = mosquitto_pub(server, version, *creds)
        assert bad.returncode != 0 and "bad user name or password" in bad.stderr.lower(), (creds, bad.stderr)
    anonymous = mosquitto_pub(server, version)
    assert anonymous.returncode != 0 and "not authori" in anonymous.stderr.lower(), anonymous.stderr


def paho_connack(server: SluiceProcess, protocol: paho.MQTTProtocolVersion, password: str | None) -> int:
    got: list[int] = []
    done = threading.Event()

    def on_connect(client: paho.Client, userdata: object, flags: object, reason: object, props: object) -> None:
        got.append(int(getattr(reason, "value", 0)))
        done.set()

    client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"paho-{protocol}", protocol=protocol)
    if password is not None:
        client.username_pw_set("meter", password)
    client.on_connect = on_connect
    client.connect("127.0.0.1", server.endpoints["mqtt"]["port"])
    client.loop_start()
    try:
        assert done.wait(10), "no CONNACK"
    finally:
        client.disconnect()
        client.loop_stop()
    return got[0]


def test_paho_codes_and_failures_in_metrics(server: SluiceProcess) -> None:
    assert paho_connack(server, paho.MQTTv5, "s3cret") == 0
    assert paho_connack(server, paho.MQTTv311, "s3cret") == 0
    assert paho_connack(server, paho.MQTTv5, "wrong") == 0x86
    assert paho_connack(server, paho.MQTTv311, "wrong") == 0x86  # paho reports 3.1.1's 0x04 as 0x86
    assert paho_connack(server, paho.MQTTv5, None) == 0x87  # no credentials: not authorized (as Mosquitto)
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    failures = [line for line in text.splitlines() if line.startswith('sluice_auth_failures_total{front_door="mqtt"}')]
    assert failures and float(failures[0].split()[-1]) >= 2
    assert "mqtt login failed" in server.log.read_text()
    assert json.loads((server.data_dir / "endpoints.json").read_text())["mqtt"]  # still serving
