"""parse_json (orjson first, the stdlib for what orjson refuses) accepts and rejects exactly what the
stdlib parser does, with the same values (types and key order included) and the same error text."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ingest.errors import FormatError
from ingest.formats import Parsed, _parse_json_stdlib, parse_json

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),  # beyond 64 bits too: orjson refuses those
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)


def _outcome(parse: Callable[[bytes], Parsed], payload: bytes) -> tuple[str, str]:
    try:
        parsed = parse(payload)
    except FormatError as exc:
        return "error", str(exc)
    # json.dumps keeps key order and tells 1 from 1.0; NaN/Infinity are written as such
    return "ok", json.dumps(parsed.document)


@settings(max_examples=400)
@given(doc=documents, ensure_ascii=st.booleans(), indent=st.sampled_from([None, 1]))
def test_documents_parse_like_the_stdlib(doc: object, ensure_ascii: bool, indent: int | None) -> None:
    payload = json.dumps(doc, ensure_ascii=ensure_ascii, indent=indent).encode("utf-8", "surrogatepass")
    assert _outcome(parse_json, payload) == _outcome(_parse_json_stdlib, payload)


@settings(max_examples=400)
@given(payload=st.binary(max_size=40) | st.text(alphabet='{}[]",:0123456789.eE+-tfnrul \\\t\n', max_size=30).map(
    str.encode))
@example(b'{"a": 1, "a": 2, "b": [1e400, -0, 0.1]}')  # duplicate keys: the last value, at the first position
@example(b'{"v": NaN, "w": -Infinity}')
@example(b'"\\ud800"')  # a lone surrogate: legal JSON text for Python
@example(b"\xef\xbb\xbf{}")  # a UTF-8 byte order mark
@example(b"\xff")
@example(b"")
def test_arbitrary_bytes_parse_or_fail_like_the_stdlib(payload: bytes) -> None:
    assert _outcome(parse_json, payload) == _outcome(_parse_json_stdlib, payload)


def test_values_are_plain_python_types() -> None:
    doc = parse_json(b'{"device_id": "d-1", "t": 1700000000123, "v": 21.5, "ok": true, "n": null}').document
    assert doc == {"device_id": "d-1", "t": 1700000000123, "v": 21.5, "ok": True, "n": None}
    assert type(doc["t"]) is int and type(doc["v"]) is float
    assert math.isnan(parse_json(b"NaN").document)
