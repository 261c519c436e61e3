"""JSON record values for the processors' hot path: orjson where it agrees with the stdlib.

``loads(raw)`` returns what ``json.loads(raw.decode())`` returns and raises what it raises, about
four times faster on sensor-sized documents (bench/RESULTS.md, "Stream processors"). orjson is
stricter (no NaN/Infinity, no lone surrogates): what it refuses goes through the stdlib, which
accepts it or raises its own error. orjson reads integers beyond 64 bits as floats where the stdlib
keeps the exact int, so values with 19 or more digits in a row take the stdlib path (the same rule
as ``ingest.formats``, which processors may not import). ``dumps`` is the encoder of values that
cross a repartition topic (see ``processors.repartition``).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["DIGITS_TO_9", "LONG_DIGITS", "loads", "orjson_safe"]

# every digit mapped to "9": nineteen nines in a row mark a possibly-long integer (3x quicker than a regex)
DIGITS_TO_9 = bytes(0x39 if 0x30 <= b <= 0x39 else b for b in range(256))
LONG_DIGITS = b"9" * 19
_ORJSON_LOADS = orjson.loads
_ORJSON_ERROR = orjson.JSONDecodeError


def orjson_safe(raw: bytes) -> bool:
    """No run of 19+ digits: orjson reads every number in ``raw`` as the stdlib would."""
    return LONG_DIGITS not in raw.translate(DIGITS_TO_9)


def loads(raw: bytes) -> Any:
    if LONG_DIGITS not in raw.translate(DIGITS_TO_9):
        try:
            return _ORJSON_LOADS(raw)
        except _ORJSON_ERROR:
            pass
    return json.loads(raw.decode())
