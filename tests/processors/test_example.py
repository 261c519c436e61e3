"""The shipped sensor example: averages, late data and jump alerts on the lectures' workload."""

from __future__ import annotations

import pytest

from processors.examples.sensors import build
from processors.testing import Harness
from tests.processors.workloads import batch_window_means, sensor_readings, shuffle_by


def test_sensor_example_averages_late_data_and_alerts() -> None:
    env = {"SENSORS_INPUT": "in", "SENSORS_OUTPUT": "avg", "SENSORS_LATE": "late", "SENSORS_ALERTS": "alerts"}
    pipeline = build(env)
    assert pipeline.sink_topics()[:3] == ["avg", "alerts", "late"]
    readings = sensor_readings(30)
    h = Harness(pipeline)
    for r in shuffle_by(readings, 7_000):
        h.send(r)
    late_one = dict(readings[0], temp=1000.0)
    h.send(late_one)  # 30 s behind: beyond 5 s lateness
    h.eof()
    assert h.final_results("avg") == {k: pytest.approx(v) for k, v in batch_window_means(readings, 10_000).items()}
    assert [o["temp"] for o in h.outputs("late")] == [1000.0]
    # alerts follow arrival order per sensor, as a keyed process function sees it
    expected = []
    last: dict[str, float] = {}
    for r in [*shuffle_by(readings, 7_000), late_one]:
        prev = last.get(r["sensor"])
        if prev is not None and prev > 0 and r["temp"] > 1.1 * prev:
            expected.append((r["sensor"], r["temp"]))
        last[r["sensor"]] = r["temp"]
    alerts = [(o["sensor"], o["temp"]) for o in h.outputs("alerts")]
    assert alerts == expected and len(alerts) > 10
