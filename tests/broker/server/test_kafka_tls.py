"""Kafka over TLS with real clients: SSL and SASL_SSL on one port (confluent-kafka, kcat, aiokafka), client
certificates (mTLS) as Kafka's DefaultKafkaPrincipalBuilder names them, and garbage on the TLS port."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError as AioKafkaError
from confluent_kafka import Consumer, KafkaError, Producer

from broker.groups.coordinator import GroupCoordinator
from broker.groups.offsets import MemoryOffsetStore
from broker.log.memory import MemoryLogStore
from broker.security import Authenticator, Principal, UserStore
from broker.security.tls import TlsFiles, build_server_context
from broker.server.handlers_common import ConnectionInfo
from broker.server.kafka import KafkaServer, KafkaServerConfig
from sluice.dev_certs import DevCertificates
from tests.broker.server.conftest import SluiceProcess
from tests.tls_certs import client_context, make_certs, tls_env

PASSWORD = "correct horse"
MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCertificates:
    return make_certs(tmp_path_factory.mktemp("kafka-tls") / "tls", clients=("device-1",))


@pytest.fixture(scope="module")
def ssl_server(tmp_path_factory: pytest.TempPathFactory, certs: DevCertificates) -> Iterator[SluiceProcess]:
    """TLS, auth off: Kafka's SSL listener."""
    proc = SluiceProcess(tmp_path_factory.mktemp("ssl") / "data", env=tls_env(certs))
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def sasl_ssl_server(tmp_path_factory: pytest.TempPathFactory, certs: DevCertificates) -> Iterator[SluiceProcess]:
    """TLS with client certificates and auth required: SASL_SSL, and SSL for clients with a certificate."""
    data = tmp_path_factory.mktemp("sasl-ssl") / "data"
    UserStore(data).add("alice", PASSWORD)
    # both logins may do everything (ACLs are test_acl_kafka.py's subject)
    proc = SluiceProcess(data, env={**tls_env(certs, client_ca=True), "SLUICE_SECURITY__AUTH": "required",
                                    "SLUICE_SECURITY__SUPER_USERS": '["alice", "User:CN=device-1,O=Sluice dev"]'})
    proc.start()
    yield proc
    proc.stop()


def ssl_config(server: SluiceProcess, certs: DevCertificates) -> dict[str, Any]:
    return {"bootstrap.servers": server.bootstrap, "security.protocol": "SSL", "ssl.ca.location": str(certs.ca)}


def sasl_ssl_config(server: SluiceProcess, certs: DevCertificates, mechanism: str, password: str) -> dict[str, Any]:
    return {"bootstrap.servers": server.bootstrap, "security.protocol": "SASL_SSL", "ssl.ca.location": str(certs.ca),
            "sasl.mechanism": mechanism, "sasl.username": "alice", "sasl.password": password}


def produce_and_consume(config: dict[str, Any], topic: str) -> None:
    producer = Producer({**config, "linger.ms": 0})
    delivered: list[KafkaError | None] = []
    producer.produce(topic, b"over tls", on_delivery=lambda err, _msg: delivered.append(err))
    assert producer.flush(30) == 0 and delivered == [None]
    consumer = Consumer({**config, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        message = consumer.poll(30)
        assert message is not None and message.error() is None and message.value() == b"over tls"
    finally:
        consumer.close()


def login_fails(config: dict[str, Any]) -> KafkaError:
    """The error librdkafka reports for a refused connection (first one seen)."""
    seen = threading.Event()
    errors: list[KafkaError] = []

    def on_error(err: KafkaError) -> None:
        errors.append(err)
        seen.set()

    producer = Producer({**config, "error_cb": on_error, "linger.ms": 0, "message.timeout.ms": 5000})
    producer.produce("refused", b"x")
    deadline = 30.0
    while not seen.is_set() and deadline > 0:
        producer.poll(0.2)
        deadline -= 0.2
    producer.purge()
    producer.flush(1)
    assert errors, "the client saw no error"
    return errors[0]


def test_confluent_kafka_over_ssl(ssl_server: SluiceProcess, certs: DevCertificates) -> None:
    produce_and_consume(ssl_config(ssl_server, certs), "ssl-confluent")


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed")
def test_kcat_over_ssl(ssl_server: SluiceProcess, certs: DevCertificates) -> None:
    common = ["-b", ssl_server.bootstrap, "-X", "security.protocol=ssl", "-X", f"ssl.ca.location={certs.ca}"]
    subprocess.run(["kcat", "-P", "-t", "ssl-kcat", *common], input=b"one\ntwo\n", check=True, timeout=60)
    out = subprocess.run(["kcat", "-C", "-t", "ssl-kcat", "-e", "-q", *common], capture_output=True, check=True,
                         timeout=60)
    assert out.stdout.split() == [b"one", b"two"]


async def test_aiokafka_over_ssl(ssl_server: SluiceProcess, certs: DevCertificates) -> None:
    context = client_context(certs)
    producer = AIOKafkaProducer(bootstrap_servers=ssl_server.bootstrap, security_protocol="SSL", ssl_context=context)
    await producer.start()
    try:
        await producer.send_and_wait("ssl-aiokafka", b"aio over tls")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer("ssl-aiokafka", bootstrap_servers=ssl_server.bootstrap, security_protocol="SSL",
                                ssl_context=context, auto_offset_reset="earliest")
    await consumer.start()
    try:
        message = await asyncio.wait_for(consumer.getone(), 30)
        assert message.value == b"aio over tls"
    finally:
        await consumer.stop()


def test_plaintext_and_garbage_on_the_tls_port_leave_no_traceback(ssl_server: SluiceProcess,
                                                                   certs: DevCertificates) -> None:
    for junk in (b"\x00\x00\x00\x0c\x00\x12\x00\x03\x00\x00\x00\x01\x00\x00", b"GET / HTTP/1.1\r\n\r\n",
                 b"\x16\x03\x01\x00\x05hello", bytes(range(256))):
        with socket.create_connection(("127.0.0.1", ssl_server.port), timeout=10) as sock:
            sock.sendall(junk)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(4096):  # the server answers with an alert or nothing, then closes
                pass
    produce_and_consume(ssl_config(ssl_server, certs), "ssl-after-garbage")  # still serving
    log = ssl_server.log_text()
    assert "Traceback" not in log and "ERROR" not in log, log[-3000:]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_sasl_ssl_login(sasl_ssl_server: SluiceProcess, certs: DevCertificates,
                                        mechanism: str) -> None:
    produce_and_consume(sasl_ssl_config(sasl_ssl_server, certs, mechanism, PASSWORD), f"sasl-ssl-{mechanism}")


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_confluent_kafka_sasl_ssl_bad_password(sasl_ssl_server: SluiceProcess, certs: DevCertificates,
                                               mechanism: str) -> None:
    error = login_fails(sasl_ssl_config(sasl_ssl_server, certs, mechanism, "wrong"))
    assert error.code() == KafkaError._AUTHENTICATION, error


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed")
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kcat_sasl_ssl(sasl_ssl_server: SluiceProcess, certs: DevCertificates, mechanism: str) -> None:
    def kcat(password: str, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["kcat", "-b", sasl_ssl_server.bootstrap, "-X", "security.protocol=SASL_SSL",
             "-X", f"ssl.ca.location={certs.ca}", "-X", f"sasl.mechanisms={mechanism}",
             "-X", "sasl.username=alice", "-X", f"sasl.password={password}", *args],
            input=b"hello\n", capture_output=True, timeout=60)

    topic = f"kcat-sasl-ssl-{mechanism.lower()}"
    assert kcat(PASSWORD, "-P", "-t", topic).returncode == 0
    out = kcat(PASSWORD, "-C", "-t", topic, "-e", "-q")
    assert out.returncode == 0 and out.stdout == b"hello\n", out.stderr
    refused = kcat("wrong", "-L", "-m", "3")  # refused at the first login; kcat waits out -m before exiting
    assert refused.returncode != 0 and b"Authentication failed" in refused.stderr, refused.stderr


def test_client_certificate_logs_in_without_sasl(sasl_ssl_server: SluiceProcess, certs: DevCertificates) -> None:
    config = {**ssl_config(sasl_ssl_server, certs), "ssl.certificate.location": str(certs.directory / "device-1.pem"),
              "ssl.key.location": str(certs.directory / "device-1-key.pem")}
    produce_and_consume(config, "mtls-login")
    # Without a certificate and without SASL, auth = required refuses the connection.
    error = login_fails(ssl_config(sasl_ssl_server, certs))
    assert error.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._AUTHENTICATION), error


async def test_principal_is_the_certificate_dn_or_the_sasl_user(tmp_path: Path, certs: DevCertificates) -> None:
    """As Kafka's DefaultKafkaPrincipalBuilder: SSL with a verified certificate -> User:<RFC 2253 DN>; SASL over
    TLS -> the SASL user even when a certificate was shown; no certificate -> ANONYMOUS (auth off)."""
    users = UserStore(tmp_path)
    users.add("alice", PASSWORD)
    context = build_server_context(TlsFiles(certs.cert, certs.key, client_ca=certs.ca))
    seen: list[Principal] = []
    for authenticator in (None, Authenticator(users)):
        coordinator = GroupCoordinator(MemoryOffsetStore())
        await coordinator.start()
        srv = KafkaServer(MemoryLogStore(default_partitions=1), coordinator, KafkaServerConfig(port=0),
                          authenticator=authenticator, tls=context)
        await srv.start()
        dispatch = srv._dispatch

        async def observe(frame: bytes | memoryview, conn: ConnectionInfo, dispatch: Any = dispatch) -> Any:
            seen.append(conn.principal)  # observed only: the real dispatch serves the request
            return await dispatch(frame, conn)

        srv._dispatch = observe  # type: ignore[method-assign]
        base = {"bootstrap.servers": f"127.0.0.1:{srv.port}", "security.protocol": "SSL",
                "ssl.ca.location": str(certs.ca), "linger.ms": 0}
        with_cert = {**base, "ssl.certificate.location": str(certs.directory / "device-1.pem"),
                     "ssl.key.location": str(certs.directory / "device-1-key.pem")}
        try:
            if authenticator is None:
                await asyncio.to_thread(_produce_one, with_cert)
                assert set(seen) == {Principal("CN=device-1,O=Sluice dev")}
                seen.clear()
                await asyncio.to_thread(_produce_one, base)
                assert set(seen) == {Principal("ANONYMOUS")}
            else:
                seen.clear()
                sasl = {**with_cert, "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
                        "sasl.username": "alice", "sasl.password": PASSWORD}
                await asyncio.to_thread(_produce_one, sasl)
                assert set(seen) == {Principal("alice")}
        finally:
            await srv.stop()
            await coordinator.stop()


def _produce_one(config: dict[str, Any]) -> None:
    producer = Producer(config)
    delivered: list[KafkaError | None] = []
    producer.produce("principals", b"x", on_delivery=lambda err, _msg: delivered.append(err))
    assert producer.flush(30) == 0 and delivered == [None]



@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
async def test_aiokafka_sasl_ssl(sasl_ssl_server: SluiceProcess, certs: DevCertificates, mechanism: str) -> None:
    common: dict[str, Any] = {"bootstrap_servers": sasl_ssl_server.bootstrap, "security_protocol": "SASL_SSL",
                              "ssl_context": client_context(certs), "sasl_mechanism": mechanism,
                              "sasl_plain_username": "alice"}
    topic = f"aio-sasl-ssl-{mechanism.lower()}"
    producer = AIOKafkaProducer(**common, sasl_plain_password=PASSWORD)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"aio over sasl_ssl")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, **common, sasl_plain_password=PASSWORD, auto_offset_reset="earliest")
    await consumer.start()
    try:
        message = await asyncio.wait_for(consumer.getone(), 30)
        assert message.value == b"aio over sasl_ssl"
    finally:
        await consumer.stop()
    refused = AIOKafkaProducer(**common, sasl_plain_password="wrong")
    with pytest.raises(AioKafkaError):
        await refused.start()
    await refused.stop()
