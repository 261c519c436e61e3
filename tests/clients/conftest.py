"""Client tests run against a real Sluice (a subprocess), and against a second Kafka-protocol endpoint
(a Kafka or Redpanda cluster) when SLUICE_TEST_KAFKA_BOOTSTRAP names one."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sluice_server import SluiceProcess


@pytest.fixture(scope="session")
def sluice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    server = SluiceProcess(Path(tmp_path_factory.mktemp("sluice-clients")) / "data").start()
    yield server
    server.stop()


@pytest.fixture(params=["sluice", "external-kafka"])
def bootstrap(request: pytest.FixtureRequest) -> str:
    if request.param == "sluice":
        server: SluiceProcess = request.getfixturevalue("sluice")
        return server.bootstrap
    external = os.environ.get("SLUICE_TEST_KAFKA_BOOTSTRAP")
    if not external:
        pytest.skip("SLUICE_TEST_KAFKA_BOOTSTRAP is not set (no second Kafka-protocol endpoint to run against)")
    return external


@pytest.fixture
def topic() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"
