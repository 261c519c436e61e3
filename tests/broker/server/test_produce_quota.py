"""A producer over its produce quota (``security.produce_quota_bytes_per_s``) is throttled as by Kafka: Produce
answers carry throttle_time_ms (librdkafka's throttle callback sees it) and its throughput is held near the
quota. The bound asserted is generous and one-sided (a slow machine only makes the run longer)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from broker.security import UserStore
from tests.broker.server.conftest import SluiceProcess

QUOTA = 100_000  # bytes/s
MESSAGES, SIZE = 400, 1000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    # Short windows (2 x 0.5 s instead of Kafka's 11 x 1 s) so the test takes seconds, not tens of seconds.
    proc = SluiceProcess(tmp_path_factory.mktemp("quota") / "data", env={
        "SLUICE_SECURITY__PRODUCE_QUOTA_BYTES_PER_S": str(QUOTA),
        "SLUICE_SECURITY__QUOTA_WINDOW_NUM": "2", "SLUICE_SECURITY__QUOTA_WINDOW_SIZE_S": "0.5"})
    proc.start()
    yield proc
    proc.stop()


def test_confluent_kafka_producer_over_quota_is_throttled(server: SluiceProcess) -> None:
    throttles: list[int] = []
    producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 5, "batch.size": 16_384,
                         "throttle_cb": lambda event: throttles.append(int(event.throttle_time * 1000))})
    delivered: list[object] = []
    started = time.monotonic()
    for i in range(MESSAGES):
        producer.produce("quota", b"x" * SIZE, key=b"%d" % i, on_delivery=lambda err, _m: delivered.append(err))
        producer.poll(0)
    assert producer.flush(60) == 0
    elapsed = time.monotonic() - started
    assert delivered == [None] * MESSAGES  # throttled, never refused or lost
    assert throttles and max(throttles) > 0, "librdkafka saw no throttle_time_ms"
    sent = MESSAGES * SIZE
    # At the quota this takes about sent / QUOTA = 4 s (less the first half-second window); unthrottled,
    # a fraction of a second. Assert at most twice the quota's rate.
    assert sent / elapsed <= 2 * QUOTA, f"{sent / elapsed:.0f} B/s against a quota of {QUOTA} B/s"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    data = tmp_path_factory.mktemp("quota-sasl") / "data"
    for user in ("meter", "bulk"):
        UserStore(data).add(user, f"{user} pw")
    proc = SluiceProcess(data, env={
        "SLUICE_SECURITY__AUTH": "required", "SLUICE_SECURITY__SUPER_USERS": '["meter", "bulk"]',
        "SLUICE_SECURITY__PRODUCE_QUOTA_BYTES_PER_S": str(QUOTA),
        "SLUICE_SECURITY__PRODUCE_QUOTA_OVERRIDES": '{"bulk": 0}',  # bulk: unlimited
        "SLUICE_SECURITY__QUOTA_WINDOW_NUM": "2", "SLUICE_SECURITY__QUOTA_WINDOW_SIZE_S": "0.5"})
    proc.start()
    yield proc
    proc.stop()


def produce_as(server: SluiceProcess, user: str) -> list[int]:
    throttles: list[int] = []
    producer = Producer({"bootstrap.servers": server.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": f"{user} pw",
                         "linger.ms": 5, "batch.size": 16_384,
                         "throttle_cb": lambda event: throttles.append(int(event.throttle_time * 1000))})
    for i in range(MESSAGES):
        producer.produce(f"quota-{user}", b"x" * SIZE, key=b"%d" % i)
        producer.poll(0)
    assert producer.flush(60) == 0
    return throttles


def test_the_quota_is_per_principal_with_overrides(secured: SluiceProcess) -> None:
    assert not any(produce_as(secured, "bulk"))  # override 0: never throttled
    assert max(produce_as(secured, "meter")) > 0  # the default quota applies to the SASL principal
