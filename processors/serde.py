"""How items become output records, and the header names processors write.

Default sink encoding: a ``WindowResult`` gets the deterministic key ``[window_start, window_end,
key]`` (JSON) and a ``sluice-emit: first|update|early`` header besides an ``emit`` field; a
``LateRecord`` keeps the item with ``sluice-late-reason``; ``Emit`` is written as given; ``bytes``
raw; anything else as JSON.
"""

from __future__ import annotations

import json
from typing import Any

from processors.operators import Emit
from processors.windows import LateRecord, WindowResult

__all__ = [
    "HEADER_EMIT",
    "HEADER_ERROR",
    "HEADER_EVENT_TIME",
    "HEADER_LATE_REASON",
    "HEADER_SOURCE",
    "HEADER_WATERMARK",
    "default_serialize",
    "to_json",
    "window_key",
]

HEADER_EMIT = "sluice-emit"
HEADER_LATE_REASON = "sluice-late-reason"
HEADER_EVENT_TIME = "sluice-event-time"
HEADER_WATERMARK = "sluice-watermark"  # on input: a heartbeat / punctuation; on output: the watermark seen
HEADER_ERROR = "sluice-error"
HEADER_SOURCE = "sluice-source"  # topic/partition/offset of a dead-lettered record


def to_json(value: Any) -> bytes:
    return _ENCODE(value).encode()


def _fallback(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    return repr(value)


# json.dumps with these options builds a JSONEncoder per call (a third of its time on a window result);
# one encoder, the same output
_ENCODE = json.JSONEncoder(separators=(",", ":"), default=_fallback).encode


def window_key(result: WindowResult) -> bytes:
    return to_json([result.window_start, result.window_end, result.key])


def default_serialize(item: Any) -> Emit:
    if isinstance(item, WindowResult):
        return Emit(to_json(item.to_dict()), window_key(item), ((HEADER_EMIT, item.emit.encode()),))
    if isinstance(item, LateRecord):
        headers = (
            (HEADER_LATE_REASON, item.reason.encode()),
            (HEADER_EVENT_TIME, str(item.timestamp).encode()),
            (HEADER_WATERMARK, str(item.watermark).encode()),
        )
        return Emit(to_json(item.value), None if item.key is None else to_json(item.key), headers)
    if isinstance(item, Emit):
        return item
    if isinstance(item, bytes):
        return Emit(item)
    return Emit(to_json(item))
