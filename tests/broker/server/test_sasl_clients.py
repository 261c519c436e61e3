"""Real Kafka clients log in to a Sluice with ``security.auth = "required"``: confluent-kafka (librdkafka), kcat
and aiokafka, with SASL_PLAINTEXT and each mechanism, good and bad passwords; failures are logged and counted."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError as AioKafkaError
from confluent_kafka import Consumer, KafkaError, Producer

from broker.security import UserStore
from tests.broker.server.conftest import SluiceProcess

MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
PASSWORD = "correct horse"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    data = tmp_path_factory.mktemp("sasl") / "data"
    UserStore(data).add("alice", PASSWORD)  # offline, before the broker starts (the documented first step)
    # alice may do everything (ACLs are another test's subject); /metrics is read without credentials
    proc = SluiceProcess(data, env={"SLUICE_SECURITY__AUTH": "required", "SLUICE_HTTP__ENABLED": "true",
                                    "SLUICE_HTTP__PORT": "0", "SLUICE_SECURITY__SUPER_USERS": '["alice"]',
                                    "SLUICE_SECURITY__OPEN_METRICS": "true"})
    proc.start()
    yield proc
    proc.stop()


def sasl(server: SluiceProcess, mechanism: str, password: str) -> dict[str, str]:
    return {"bootstrap.servers": server.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": "alice", "sasl.password": password}


def metrics(server: SluiceProcess) -> str:
    port = json.loads((server.data_dir / "endpoints.json").read_text())["http"]["port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def auth_failures(server: SluiceProcess) -> float:
    for line in metrics(server).splitlines():
        if line.startswith('sluice_auth_failures_total{front_door="kafka"}'):
            return float(line.split()[-1])
    raise AssertionError("no sluice_auth_failures_total series")


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_produces_and_consumes_after_login(server: SluiceProcess, mechanism: str) -> None:
    topic = f"sasl-{mechanism.lower()}"
    producer = Producer({**sasl(server, mechanism, PASSWORD), "linger.ms": 0})
    delivered: list[KafkaError | None] = []
    producer.produce(topic, b"hello", on_delivery=lambda err, _msg: delivered.append(err))
    assert producer.flush(30) == 0 and delivered == [None]
    consumer = Consumer({**sasl(server, mechanism, PASSWORD), "group.id": f"g-{mechanism}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        message = consumer.poll(30)
        assert message is not None and message.error() is None and message.value() == b"hello"
    finally:
        consumer.close()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_bad_password_is_an_authentication_error(server: SluiceProcess, mechanism: str) -> None:
    before = auth_failures(server)
    failed = threading.Event()
    errors: list[KafkaError] = []

    def on_error(err: KafkaError) -> None:
        errors.append(err)
        if err.code() == KafkaError._AUTHENTICATION:
            failed.set()

    producer = Producer({**sasl(server, mechanism, "wrong"), "error_cb": on_error})
    producer.produce("sasl-denied", b"never stored")
    producer.poll(0)
    while not failed.is_set():
        producer.poll(0.2)
        assert len(errors) < 50, errors
    refusal = next(e for e in errors if e.code() == KafkaError._AUTHENTICATION)
    assert "Authentication failed: Invalid" in refusal.str()
    producer.purge()
    assert producer.flush(5) == 0  # the message was never sent: purged from the queue
    assert auth_failures(server) > before
    assert "kafka login failed" in server.log_text()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kcat_lists_metadata_with_good_password_only(server: SluiceProcess, mechanism: str) -> None:
    assert shutil.which("kcat"), "kcat is installed by scripts/install-system-deps.sh"

    def kcat(password: str, wait_s: int = 10) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kcat", "-b", server.bootstrap, "-L", "-m", str(wait_s), "-X", "security.protocol=SASL_PLAINTEXT",
             "-X", f"sasl.mechanisms={mechanism}", "-X", "sasl.username=alice", "-X", f"sasl.password={password}"],
            capture_output=True, text=True, timeout=60, check=False)

    good = kcat(PASSWORD)
    assert good.returncode == 0, good.stderr
    assert "1 brokers:" in good.stdout
    bad = kcat("wrong", wait_s=3)  # refused at the first login; kcat would wait out -m before exiting
    assert bad.returncode != 0
    assert "Authentication failed" in bad.stderr or "Authentication failed" in bad.stdout, bad.stderr


def test_kcat_without_sasl_is_refused(server: SluiceProcess) -> None:
    plain = subprocess.run(["kcat", "-b", server.bootstrap, "-L", "-m", "5"], capture_output=True, text=True,
                           timeout=60, check=False)
    assert plain.returncode != 0 and "1 brokers:" not in plain.stdout


@pytest.mark.parametrize("mechanism", MECHANISMS)
async def test_aiokafka_with_sasl(server: SluiceProcess, mechanism: str) -> None:
    common = {"bootstrap_servers": server.bootstrap, "security_protocol": "SASL_PLAINTEXT",
              "sasl_mechanism": mechanism, "sasl_plain_username": "alice"}
    topic = f"aio-{mechanism.lower()}"
    producer = AIOKafkaProducer(**common, sasl_plain_password=PASSWORD)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"from aiokafka")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, **common, sasl_plain_password=PASSWORD, auto_offset_reset="earliest")
    await consumer.start()
    try:
        record = await consumer.getone()
        assert record.value == b"from aiokafka"
    finally:
        await consumer.stop()
    refused = AIOKafkaProducer(**common, sasl_plain_password="wrong")
    with pytest.raises(AioKafkaError):
        await refused.start()
    await refused.stop()
