"""The processors' JSON fast path (orjson) reads every value as ``json.loads`` does, or fails as it does."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors import jsonvalues
from processors.pipeline import Pipeline
from processors.testing import Harness

# documents where orjson alone would differ from the stdlib: long integers (orjson reads floats),
# NaN/Infinity and lone surrogates (orjson refuses, the stdlib accepts), and plain errors
AWKWARD = [
    b'{"n": 123456789012345678901234567890}',
    b"[18446744073709551616, -9223372036854775809]",
    b'{"t": NaN, "u": Infinity, "v": -Infinity}',
    b'"\\ud800"',
    b" {\"a\": 1} ",
    b'{"a": 1, "a": 2}',
    b"1e400",
    b"[1,]",
    b"\xef\xbb\xbf{}",
    b'{"a": "\xff"}',
    b"",
    b"{} {}",
]


def stdlib(raw: bytes) -> Any:
    return json.loads(raw.decode())


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def outcome(fn: Any, raw: bytes) -> tuple[str, Any]:
    try:
        return "ok", fn(raw)
    except Exception as exc:
        return "error", (type(exc), str(exc))


@pytest.mark.parametrize("raw", AWKWARD)
def test_loads_agrees_with_the_stdlib_on_awkward_documents(raw: bytes) -> None:
    got, want = outcome(jsonvalues.loads, raw), outcome(stdlib, raw)
    assert got[0] == want[0]
    assert same(got[1], want[1]) if got[0] == "ok" else got[1] == want[1]


json_docs = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30) | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(json_docs)
def test_loads_agrees_with_the_stdlib_on_generated_documents(doc: Any) -> None:
    raw = json.dumps(doc).encode()  # NaN/Infinity as the stdlib writes them
    assert same(jsonvalues.loads(raw), stdlib(raw))


def test_the_executor_keeps_long_integers_nan_and_surrogates_and_dead_letters_what_json_refuses() -> None:
    stream = Pipeline.source("in", group="g")
    stream.map(lambda v: {"v": v}).sink("out")
    h = Harness(stream)
    h.send_batch([b'{"n": 123456789012345678901234567890}', b"NaN", b'"\\ud800"', b"[1,]", b'{"ok": 1.5}'],
                 timestamps=[1, 2, 3, 4, 5])
    values = [json.loads(r.value or b"null") for r in h.sent if r.topic == "out"]
    assert values[0] == {"v": {"n": 123456789012345678901234567890}}
    assert isinstance(values[0]["v"]["n"], int)
    assert math.isnan(values[1]["v"])  # the sink writes NaN as the stdlib does
    assert values[2] == {"v": "\ud800"}
    assert values[3] == {"v": {"ok": 1.5}}
    dead = [r for r in h.sent if r.topic == "g.dead-letter"]
    assert [r.value for r in dead] == [b"[1,]"]
    assert b"Expecting value" in (dict(dead[0].headers)["sluice-error"] or b"")  # the stdlib's message


@pytest.mark.parametrize("value", [
    {"key": "s1", "window_start": 0, "value": 1.5, "emit": "first"}, [float("nan"), float("inf"), -0.0, 1e16],
    {"é": "\u2028\"x", 1: (1, 2)}, b"\xffbytes", {"s": frozenset({1})}, 2**70, "line\nbreak", object,
])
def test_output_encoding_is_json_dumps_with_the_sinks_options(value: Any) -> None:
    """The sinks' encoder (one, reused) writes what ``json.dumps`` with the same options writes."""
    from processors.serde import _fallback, to_json

    assert to_json(value) == json.dumps(value, separators=(",", ":"), default=_fallback).encode()
