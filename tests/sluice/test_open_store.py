"""`sluice serve` picks the store from settings: segment files by default, memory on request."""

from __future__ import annotations

from pathlib import Path

from broker.log.memory import MemoryLogStore
from broker.log.segment import SegmentLogStore
from broker.protocol.records import RecordSpec
from sluice.config import load_settings
from sluice.serve import open_store


async def test_default_backend_is_segment_files_under_data_dir_logs(tmp_path: Path) -> None:
    store = open_store(load_settings(data_dir=tmp_path))
    assert isinstance(store, SegmentLogStore)
    await store.start()
    await store.append_records("t", [RecordSpec(b"x")])
    await store.close()
    assert (tmp_path / "logs" / "t-0" / f"{0:020d}.log").stat().st_size > 0


def test_memory_backend(tmp_path: Path) -> None:
    assert isinstance(open_store(load_settings(data_dir=tmp_path, storage={"backend": "memory"})), MemoryLogStore)
