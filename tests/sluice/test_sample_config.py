"""deploy/sluice.toml: it loads, it only restates the defaults, and its routes route like the built-ins."""

from __future__ import annotations

from pathlib import Path

from ingest.router import Router
from ingest.routing import RawMessage, Rejected, Routed, SourceRef
from sluice.components.ingest_core import build_router
from sluice.config import Settings, load_settings

SAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "sluice.toml"
MQTT = SourceRef("mqtt", "default")
TCP = SourceRef("tcp", "default", "json")

MESSAGES = [
    (MQTT, RawMessage(b'{"sensor":"sensor_1","temp":71.2,"ts":1714564800000}', "sensors/sensor_1", "dev1", 5)),
    (MQTT, RawMessage(b'{"temp":71.2,"ts":1714564800123}', "sensors/s9", "dev9", 5)),
    (MQTT, RawMessage(b"71.2", "sensors/s9", "dev9", 5)),  # not JSON: dead letter
    (MQTT, RawMessage(b'{"temp":71.2}', "sensors/s9", "dev9", 5)),  # no ts: dead letter
    (MQTT, RawMessage(b"on", "home/lamp", "lamp", 5)),  # another shape: the mqtt catch-all
    (TCP, RawMessage(b'{"sensor":"sensor_2","temp":60.0,"ts":1714564800456}', arrival_ms=5)),
    (TCP, RawMessage(b'{"device_id":"pump","rpm":1200}', arrival_ms=5)),  # no sensor field: tcp
]


def _outcome(router: Router, source: SourceRef, message: RawMessage) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for r in router.route(source, message):
        if isinstance(r, Rejected):
            out.append(("rejected", r.reason.split(":", 1)[-1]))
        else:
            assert isinstance(r, Routed)
            out.append((r.topic, r.key, r.record.timestamp, r.device))
    return out


def test_sample_config_loads_and_sets_only_defaults() -> None:
    loaded = load_settings(SAMPLE)
    defaults = Settings()
    assert loaded.model_dump(exclude={"ingest": {"routes"}}) == defaults.model_dump(exclude={"ingest": {"routes"}})
    assert [r["name"] for r in loaded.ingest.routes] == ["sensors-mqtt", "sensors-tcp"]


def test_sample_routes_route_like_the_builtin_defaults() -> None:
    from_file = build_router(load_settings(SAMPLE).ingest)
    builtin = build_router(Settings().ingest)
    assert builtin.rules == [] and len(from_file.rules) == 2
    for source, message in MESSAGES:
        assert _outcome(from_file, source, message) == _outcome(builtin, source, message)
    assert _outcome(builtin, *MESSAGES[0]) == [("sensors", b"sensor_1", 1714564800000, "dev1")]
    assert _outcome(builtin, *MESSAGES[1]) == [("sensors", b"s9", 1714564800123, "dev9")]
    assert _outcome(builtin, *MESSAGES[4]) == [("mqtt", b"home/lamp", 5, "lamp")]
    assert _outcome(builtin, *MESSAGES[5]) == [("sensors", b"sensor_2", 1714564800456, "sensor_2")]
    assert _outcome(builtin, *MESSAGES[6]) == [("tcp", b"pump", 5, "pump")]
    assert [kind for kind, *_ in _outcome(builtin, *MESSAGES[2]) + _outcome(builtin, *MESSAGES[3])] == [
        "rejected", "rejected"
    ]
