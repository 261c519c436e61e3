"""Keyed process functions: state scoped to the key, TTL, event- and processing-time timers."""

from __future__ import annotations

from typing import Any

from processors.operators import KeyedProcessFunction, ProcessContext
from processors.pipeline import Pipeline
from processors.testing import Harness
from processors.watermarks import BoundedOutOfOrderness
from tests.processors.workloads import T0, key_values


def test_running_average_per_key_with_value_state() -> None:
    def running_avg(v: dict[str, Any], ctx: ProcessContext) -> None:
        state = ctx.value("sum_count")
        total, n = state.get([0, 0])
        total, n = total + v["value"], n + 1
        state.set([total, n])
        ctx.emit({"key": ctx.key, "avg": total / n})

    stream = Pipeline.source("kv", group="avg", event_time=lambda v: v["ts"])
    stream.key_by(lambda v: v["key"]).process(running_avg).sink("avg")
    h = Harness(stream)
    rows = key_values(500)
    h.send_batch(rows)
    last: dict[str, float] = {}
    for o in h.outputs("avg"):
        last[o["key"]] = o["avg"]
    for key in {r["key"] for r in rows}:
        values = [r["value"] for r in rows if r["key"] == key]
        assert last[key] == sum(values) / len(values)


class Timeouts(KeyedProcessFunction):
    """Emits 'quiet' when a key gets no record for 5 s of event time, and 'stale' after 1 s of
    processing time; remembers the last value with a TTL."""

    def process(self, value: Any, ctx: ProcessContext) -> None:
        ctx.value("last", ttl_ms=2_000).set(value["v"])
        ctx.register_event_timer(ctx.timestamp + 5_000)
        ctx.register_processing_timer(ctx.now + 1_000)

    def on_timer(self, timestamp: int, ctx: ProcessContext, domain: str) -> None:
        ctx.emit({"key": ctx.key, "domain": domain, "at": timestamp, "last": ctx.value("last", ttl_ms=2_000).get()})


def test_event_and_processing_time_timers_and_ttl() -> None:
    stream = Pipeline.source("s", group="t", event_time=lambda v: v["ts"], watermarks=BoundedOutOfOrderness(0))
    stream.key_by(lambda v: v["k"]).process(Timeouts()).sink("out")
    h = Harness(stream)
    h.send({"k": "a", "v": 1, "ts": T0})
    h.send({"k": "b", "v": 2, "ts": T0 + 1_000})
    assert h.outputs("out") == []
    h.advance(1_000)
    out = h.outputs("out")
    assert [(o["key"], o["domain"], o["last"]) for o in out] == [("a", "processing", 1), ("b", "processing", 2)]
    h.advance(1_500)  # 2.5 s after the writes: the TTL of 'last' has passed
    h.send({"k": "c", "v": 3, "ts": T0 + 5_001})  # watermark T0 + 5_000: a's event timer is due
    event = [o for o in h.outputs("out") if o["domain"] == "event"]
    assert [(o["key"], o["at"], o["last"]) for o in event] == [("a", T0 + 5_000, None)]


def test_state_is_scoped_to_the_current_key() -> None:
    def count(v: Any, ctx: ProcessContext) -> None:
        c = ctx.map("counts")
        c.put(v["x"], c.get(v["x"], 0) + 1)
        ctx.list("seen").append(v["x"])
        ctx.emit({"key": ctx.key, "counts": dict(c.items()), "seen": ctx.list("seen").get()})

    stream = Pipeline.source("s", group="t", event_time=lambda v: v["ts"])
    stream.key_by(lambda v: v["k"]).process(count).sink("out")
    h = Harness(stream)
    for k, x in (("a", "p"), ("b", "p"), ("a", "q"), ("a", "p")):
        h.send({"k": k, "x": x, "ts": T0})
    last = {o["key"]: o for o in h.outputs("out")}
    assert last["a"]["counts"] == {"p": 2, "q": 1} and last["a"]["seen"] == ["p", "q", "p"]
    assert last["b"]["counts"] == {"p": 1} and last["b"]["seen"] == ["p"]


def test_rolling_reduce_and_fan_out_to_several_sinks() -> None:
    stream = Pipeline.source("s", group="t", event_time=lambda v: v["ts"])
    totals = stream.key_by(lambda v: v["k"]).reduce(lambda a, b: {"k": a["k"], "n": a["n"] + b["n"], "ts": b["ts"]})
    totals.sink("totals-a").sink("totals-b")
    stream.filter(lambda v: v["n"] > 1).map(lambda v: {"big": v["n"]}).sink("big")
    h = Harness(stream)
    for n in (1, 2, 3):
        h.send({"k": "x", "n": n, "ts": T0})
    assert [o["n"] for o in h.outputs("totals-a")] == [1, 3, 6]
    assert h.outputs("totals-a") == h.outputs("totals-b")
    assert [o["big"] for o in h.outputs("big")] == [2, 3]


def test_a_failing_user_function_dead_letters_the_item_and_keeps_going() -> None:
    stream = Pipeline.source("s", group="t", event_time=lambda v: v["ts"])
    stream.map(lambda v: {"inv": 1 / v["n"], "ts": v["ts"]}).sink("out")
    h = Harness(stream)
    h.send_batch([{"n": 1, "ts": T0}, {"n": 0, "ts": T0}, {"n": 2, "ts": T0}])
    assert [o["inv"] for o in h.outputs("out")] == [1.0, 0.5]
    dead = [r for r in h.sent if r.topic == "t.dead-letter"]
    assert len(dead) == 1 and b"ZeroDivisionError" in (dict(dead[0].headers)["sluice-error"] or b"")
