"""Store factories: the contract suite runs once per LogStore implementation."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from broker.log.api import LogStore
from broker.log.config import TopicConfig
from broker.log.memory import MemoryLogStore
from broker.log.segment import SegmentLogStore

StoreFactory = Callable[..., LogStore]


def _memory(tmp_path: Path, **kwargs: object) -> LogStore:
    return MemoryLogStore(**kwargs)  # type: ignore[arg-type]


def _segment(tmp_path: Path, **kwargs: object) -> LogStore:
    return SegmentLogStore(tmp_path / "logs", **kwargs)  # type: ignore[arg-type]


STORE_FACTORIES: dict[str, Callable[..., LogStore]] = {"memory": _memory, "segment": _segment}


@pytest.fixture(params=sorted(STORE_FACTORIES))
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def store(store_kind: str, tmp_path: Path) -> AsyncIterator[LogStore]:
    instance = STORE_FACTORIES[store_kind](tmp_path, default_config=TopicConfig())
    await instance.start()
    yield instance
    await instance.close()
