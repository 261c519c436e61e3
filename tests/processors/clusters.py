"""Where the end-to-end processor tests run: a real Sluice, or the external Kafka-protocol cluster
SLUICE_TEST_KAFKA_BOOTSTRAP names (as the client tests do)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.server.conftest import SluiceProcess

__all__ = ["TARGETS", "sluice_or_external"]

TARGETS = ["sluice", "external-kafka"]  # fixture params


def sluice_or_external(target: str, tmp_path: Path, partitions: int) -> Iterator[str]:
    """Yields a bootstrap address (for a fixture's ``yield from``); skips when the external cluster is
    asked for and none is given."""
    if target == "external-kafka":
        external = os.environ.get("SLUICE_TEST_KAFKA_BOOTSTRAP")
        if not external:
            pytest.skip("SLUICE_TEST_KAFKA_BOOTSTRAP is not set (no second Kafka-protocol endpoint to run against)")
        yield external
        return
    server = SluiceProcess(tmp_path / "data", partitions=partitions)
    server.start()
    yield server.bootstrap
    server.stop()
