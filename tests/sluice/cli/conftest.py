from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sluice_server import SluiceProcess

IDLE_TIMEOUT_S = 4.0  # a fleet still sending must not look idle: the bursty profile sends every 2 s (fleet.py)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    data = Path(tmp_path_factory.mktemp("sluice-cli")) / "data"
    proc = SluiceProcess(
        data, env={"SLUICE_TCP__ACK": "true", "SLUICE_INGEST__IDLE_TIMEOUT_S": str(IDLE_TIMEOUT_S)}
    ).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    """``sluice serve`` as ``make run`` starts it (no config file), on free ports; one per test module."""
    data = Path(tmp_path_factory.mktemp("sluice-defaults")) / "data"
    proc = SluiceProcess(data, env={"SLUICE_STORAGE__BACKEND": "segment"}).start()
    yield proc
    proc.stop()
