from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sluice_server import SluiceProcess

IDLE_TIMEOUT_S = 1.5


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    data = Path(tmp_path_factory.mktemp("sluice-cli")) / "data"
    proc = SluiceProcess(
        data, env={"SLUICE_TCP__ACK": "true", "SLUICE_INGEST__IDLE_TIMEOUT_S": str(IDLE_TIMEOUT_S)}
    ).start()
    yield proc
    proc.stop()
