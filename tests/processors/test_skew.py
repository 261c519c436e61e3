"""Lossy Counting guarantees (property test), the heavy-hitters operator, two-phase aggregation."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Hashable

from hypothesis import given, settings
from hypothesis import strategies as st

from processors.aggregations import Mean
from processors.pipeline import Pipeline
from processors.skew import LossyCounter, heavy_hitters, two_phase_aggregate
from processors.testing import Harness
from processors.watermarks import BoundedOutOfOrderness
from processors.windows import Tumbling
from tests.processors.workloads import T0


@settings(max_examples=150, deadline=None)
@given(
    items=st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=3_000),
    epsilon=st.sampled_from([0.001, 0.01, 0.02, 0.05]),
    support=st.sampled_from([0.06, 0.1, 0.2, 0.5]),
)
def test_lossy_counting_has_no_false_negatives_and_bounded_undercount(
    items: list[int], epsilon: float, support: float
) -> None:
    lc = LossyCounter(epsilon, support)
    for x in items:
        lc.add(x)
    n = len(items)
    truth: Counter[Hashable] = Counter(items)
    reported = dict(lc.heavy_hitters())
    for item, count in truth.items():
        if count >= support * n:
            assert item in reported, f"{item} has {count} >= {support}·{n} but was not reported"
        estimate = lc.estimate(item)
        assert estimate <= count
        assert count - estimate <= epsilon * n
    for item in reported:
        assert truth[item] >= (support - epsilon) * n  # what is reported is at least (s − ε)·N


def test_lossy_counting_memory_stays_small_on_a_long_skewed_stream() -> None:
    rng = random.Random(5)
    lc = LossyCounter(0.001, 0.01)
    for _ in range(200_000):
        lc.add("hot" if rng.random() < 0.3 else f"k{rng.randrange(100_000)}")
    assert dict(lc.heavy_hitters()).keys() == {"hot"}
    assert len(lc.entries) < 10_000


def test_heavy_hitters_operator_reports_per_event_time_interval_and_checkpoints() -> None:
    stream = Pipeline.source("words", group="hh", event_time=lambda v: v["ts"], watermarks=BoundedOutOfOrderness(0))
    heavy_hitters(stream, lambda v: v["w"], epsilon=0.01, support=0.2, every_ms=10_000).sink("hot")
    h = Harness(stream)
    rng = random.Random(1)
    words = ["the"] * 40 + ["sensor"] * 25 + [f"w{i}" for i in range(35)]
    rng.shuffle(words)
    h.send_batch([{"w": w, "ts": T0 + i * 100} for i, w in enumerate(words)])  # 10 s of event time
    h.send({"w": "x", "ts": T0 + 10_000})
    reports = h.outputs("hot")
    assert len(reports) == 1
    assert reports[0]["n"] == 101  # counted up to the watermark, which moves after the batch holding "x"
    assert [(i["item"], i["count"]) for i in reports[0]["items"]] == [("the", 40), ("sensor", 25)]
    snap = h.executor.snapshot()
    (entries,) = snap.values()
    assert entries[0][2]["lc"]["n"] == 101


def test_two_phase_aggregation_of_a_hot_key_equals_the_one_phase_result() -> None:
    rng = random.Random(9)
    rows = []
    for i in range(20_000):
        sensor = "sensor_0" if rng.random() < 0.6 else f"sensor_{rng.randrange(1, 10)}"
        rows.append({"sensor": sensor, "temp": round(rng.gauss(65, 20), 2), "ts": T0 + i * 5})

    def run(two_phase: bool) -> dict:
        stream = Pipeline.source("s", group="g", event_time=lambda v: v["ts"], watermarks=BoundedOutOfOrderness(0))
        if two_phase:
            two_phase_aggregate(stream, lambda v: v["sensor"], Tumbling(10_000), Mean("temp"), splits=4).sink("out")
        else:
            stream.key_by(lambda v: v["sensor"]).window(Tumbling(10_000)).aggregate(Mean("temp")).sink("out")
        h = Harness(stream)
        for i in range(0, len(rows), 500):
            h.send_batch(rows[i : i + 500])
        h.send({"sensor": "sensor_1", "temp": 0, "ts": T0 + 200_000})
        return {(o["window_start"], o["key"]): (round(o["value"], 9), o["count"]) for o in h.outputs("out")}

    one, two = run(False), run(True)
    assert len(one) == 100
    assert one == two
