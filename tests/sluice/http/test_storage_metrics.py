"""/metrics on a segment store: the log end beside the high watermark, and the segment-file descriptors."""

from __future__ import annotations

from pathlib import Path

import httpx

from broker.log.segment import SegmentLogStore
from sluice.config import HttpSettings, Settings
from sluice.http import create_app
from sluice.runtime import Runtime
from tests.sluice.http.test_metrics import samples


async def test_segment_store_metrics(tmp_path: Path) -> None:
    store = SegmentLogStore(tmp_path / "logs", max_open_files=8)
    await store.start()
    try:
        app = create_app(Runtime(Settings(data_dir=tmp_path, http=HttpSettings(port=0)), store))
        app.state.ctx.accepting = True
        store.create_topic("m", 6)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://s") as client:
            for p in range(6):
                r = await client.post("/topics/m/records", params={"partition": p}, json={"records": [{"value": p}]})
                assert r.status_code == 200, r.text
            got = samples((await client.get("/metrics")).text)
        for p in range(6):
            labels = (("partition", str(p)), ("topic", "m"))
            assert got[("sluice_partition_high_watermark", labels)] == 1
            assert got[("sluice_partition_log_end_offset", labels)] == 1
        assert 0 < got[("sluice_log_open_segment_files", ())] <= 8
        assert got[("sluice_log_segment_file_evictions_total", ())] > 0
        assert got[("sluice_log_fd_exhausted_total", ())] == 0
    finally:
        await store.close()
