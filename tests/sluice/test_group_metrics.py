"""``sluice_group_metadata_write_failures``: group metadata records the coordinator could not store are
counted on /metrics (the SyncGroup waiting for one was answered with an error);
``sluice_group_offsets_expired``: committed offsets removed because they expired."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.groups import FakeClock, GroupCoordinator, GroupSettings, MemoryOffsetStore
from sluice.components.kafka import GroupStoreCollector
from tests.broker.groups.test_coordinator import GROUP, join
from tests.broker.groups.test_group_persistence import RefusingGroupRecords


def failures(coordinator: GroupCoordinator) -> float:
    registry = CollectorRegistry()
    registry.register(GroupStoreCollector(coordinator))
    text = generate_latest(registry).decode()
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "sluice_group_metadata_write_failures_total")


async def test_a_group_record_not_stored_is_counted() -> None:
    coord = GroupCoordinator(RefusingGroupRecords(), FakeClock(), tick_interval_s=3600)
    await coord.start()
    try:
        assert failures(coord) == 0
        r = await join(coord)
        await coord.sync(GROUP, r.generation_id, r.member_id, {})
        assert failures(coord) == 1
    finally:
        await coord.stop()


def expired(coordinator: GroupCoordinator) -> float:
    registry = CollectorRegistry()
    registry.register(GroupStoreCollector(coordinator))
    text = generate_latest(registry).decode()
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "sluice_group_offsets_expired_total")


async def test_expired_offsets_are_counted() -> None:
    clock = FakeClock()
    coord = GroupCoordinator(MemoryOffsetStore(), clock, settings=GroupSettings(offsets_retention_ms=1_000),
                             tick_interval_s=3600, wall_clock=clock.time)
    await coord.start()
    try:
        await coord.commit_offsets("solo", -1, "", {("t", 0): (1, None), ("t", 1): (2, None)})
        assert expired(coord) == 0
        clock.advance(1)
        await coord.cleanup_groups()
        assert expired(coord) == 2
    finally:
        await coord.stop()
