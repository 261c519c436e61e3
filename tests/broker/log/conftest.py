"""Store factories: the contract suite runs once per LogStore implementation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol, Unpack

import pytest

from broker.log.api import LogStore
from broker.log.config import TopicConfig
from broker.log.memory import MemoryLogStore
from broker.log.segment import SegmentLogStore
from tests.broker.log.helpers import LogStoreOptions


class StoreFactory(Protocol):
    def __call__(self, tmp_path: Path, **kwargs: Unpack[LogStoreOptions]) -> LogStore: ...


def _memory(tmp_path: Path, **kwargs: Unpack[LogStoreOptions]) -> LogStore:
    return MemoryLogStore(**kwargs)


def _segment(tmp_path: Path, **kwargs: Unpack[LogStoreOptions]) -> LogStore:
    return SegmentLogStore(tmp_path / "logs", **kwargs)


STORE_FACTORIES: dict[str, StoreFactory] = {"memory": _memory, "segment": _segment}


@pytest.fixture(params=sorted(STORE_FACTORIES))
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def store(store_kind: str, tmp_path: Path) -> AsyncIterator[LogStore]:
    instance = STORE_FACTORIES[store_kind](tmp_path, default_config=TopicConfig())
    await instance.start()
    yield instance
    await instance.close()
