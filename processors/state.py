"""Keyed state for ``process`` functions: value, list and map state with an optional TTL.

State is scoped to the current key: a ``KeyState`` belongs to one key's logic, and the handles
``ctx.value(...)``/``ctx.list(...)``/``ctx.map(...)`` resolve against the key being processed.
Everything stored must be plain data (numbers, strings, bytes, lists, dicts) since checkpoints are
msgpack. TTLs are in processing-time ms; an expired entry reads as absent and is removed on access
and by ``expire(now)`` (called on processing-time ticks).
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator
from typing import Any

from processors.errors import StateError

__all__ = ["KeyState", "ListState", "MapState", "ValueState"]


class KeyState:
    """All named state of one key. Stored as ``{name: [kind, ttl_ms, payload]}``."""

    __slots__ = ("data", "now")

    def __init__(self, data: dict[str, builtins.list[Any]] | None, now: Callable[[], int]) -> None:
        self.data: dict[str, builtins.list[Any]] = data if data is not None else {}
        self.now = now

    def _slot(self, name: str, kind: str, ttl_ms: int | None, empty: Any) -> builtins.list[Any]:
        slot = self.data.get(name)
        if slot is None:
            slot = self.data[name] = [kind, ttl_ms, empty]
        elif slot[0] != kind:
            raise StateError(f"state {name!r} is a {slot[0]} state, not {kind}")
        return slot

    def value(self, name: str, ttl_ms: int | None = None) -> ValueState:
        return ValueState(self, self._slot(name, "value", ttl_ms, None))

    def list(self, name: str, ttl_ms: int | None = None) -> ListState:
        return ListState(self, self._slot(name, "list", ttl_ms, []))

    def map(self, name: str, ttl_ms: int | None = None) -> MapState:
        return MapState(self, self._slot(name, "map", ttl_ms, {}))

    def expire(self, now: int) -> None:
        for name, (kind, ttl, payload) in list(self.data.items()):
            if ttl is None:
                continue
            if kind == "value":
                if payload is not None and payload[1] <= now:
                    del self.data[name]
            elif kind == "list":
                self.data[name][2] = [e for e in payload if e[1] > now]
            else:
                self.data[name][2] = {k: e for k, e in payload.items() if e[1] > now}

    def is_empty(self) -> bool:
        return all(not slot[2] for slot in self.data.values())

    def snapshot(self) -> dict[str, builtins.list[Any]]:
        return self.data


class _Handle:
    """A named state of one key: ``_slot`` is its ``[kind, ttl_ms, payload]`` in ``_state.data``."""

    __slots__ = ("_slot", "_state")

    def __init__(self, state: KeyState, slot: list[Any]) -> None:
        self._state = state
        self._slot = slot


class ValueState(_Handle):
    __slots__ = ()

    def get(self, default: Any = None) -> Any:
        entry = self._slot[2]
        if entry is None:
            return default
        if entry[1] is not None and entry[1] <= self._state.now():
            self._slot[2] = None
            return default
        return entry[0]

    def set(self, value: Any) -> None:
        ttl = self._slot[1]
        self._slot[2] = [value, None if ttl is None else self._state.now() + ttl]

    def clear(self) -> None:
        self._slot[2] = None


class ListState(_Handle):
    __slots__ = ()

    def _live(self) -> list[list[Any]]:
        if self._slot[1] is not None:
            now = self._state.now()
            self._slot[2] = [e for e in self._slot[2] if e[1] > now]
        return self._slot[2]

    def append(self, value: Any) -> None:
        ttl = self._slot[1]
        self._slot[2].append([value, None if ttl is None else self._state.now() + ttl])

    def get(self) -> list[Any]:
        return [e[0] for e in self._live()]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.get())

    def __len__(self) -> int:
        return len(self._live())

    def clear(self) -> None:
        self._slot[2] = []


class MapState(_Handle):
    __slots__ = ()

    def _live(self) -> dict[Any, list[Any]]:
        if self._slot[1] is not None:
            now = self._state.now()
            self._slot[2] = {k: e for k, e in self._slot[2].items() if e[1] > now}
        return self._slot[2]

    def get(self, k: Any, default: Any = None) -> Any:
        entry = self._live().get(k)
        return default if entry is None else entry[0]

    def put(self, k: Any, value: Any) -> None:
        ttl = self._slot[1]
        self._slot[2][k] = [value, None if ttl is None else self._state.now() + ttl]

    def remove(self, k: Any) -> None:
        self._slot[2].pop(k, None)

    def items(self) -> list[tuple[Any, Any]]:
        return [(k, e[0]) for k, e in self._live().items()]

    def __contains__(self, k: object) -> bool:
        return k in self._live()

    def __len__(self) -> int:
        return len(self._live())

    def clear(self) -> None:
        self._slot[2] = {}
