"""The ingest core is built once per Runtime from settings.ingest and shared by every front door."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.log.memory import MemoryLogStore
from ingest.errors import ConfigError
from ingest.routing import RawMessage, Routed, SourceRef
from sluice.components.ingest_core import ingest_core
from sluice.config import load_settings
from sluice.runtime import Runtime


def test_core_is_built_once_from_toml(tmp_path: Path) -> None:
    config = tmp_path / "sluice.toml"
    config.write_text(
        """
[ingest]
dead_letter_topic = "dlq"
max_pending_bytes = 12345

[[ingest.routes]]
name = "temps"
source = "mqtt"
filter = "sensors/+/temperature"
topic = "temperatures"
key = "level:1"
format = "json"
time_field = "ts"
time_format = "rfc3339"
"""
    )
    settings = load_settings(config, data_dir=tmp_path)
    runtime = Runtime(settings, MemoryLogStore())
    core = ingest_core(runtime)
    assert ingest_core(runtime).sink is core.sink
    assert runtime.registries["ingest_sink"] is core.sink
    assert runtime.registries["ingest_health"] is core.health
    assert runtime.registries["router"] is core.router
    assert core.sink.dead_letter_topic == "dlq" and core.sink.max_pending_bytes == 12345
    (routed,) = core.router.route(
        SourceRef("mqtt", "default"), RawMessage(b'{"ts": "2024-01-01T00:00:00Z"}', "sensors/d4/temperature")
    )
    assert isinstance(routed, Routed)
    assert (routed.topic, routed.key, routed.record.timestamp) == ("temperatures", b"d4", 1_704_067_200_000)


def test_bad_route_in_config_names_it(tmp_path: Path) -> None:
    settings = load_settings(None, data_dir=tmp_path, ingest={"routes": [{"name": "x", "topic": "t", "key": "bad"}]})
    with pytest.raises(ConfigError, match=r"ingest.routes\[0\]"):
        ingest_core(Runtime(settings, MemoryLogStore()))
