"""``sluice_group_metadata_write_failures``: group metadata records the coordinator could not store are
counted on /metrics (the SyncGroup waiting for one was answered with an error)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.groups import FakeClock, GroupCoordinator
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
