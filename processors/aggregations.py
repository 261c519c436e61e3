"""Window aggregations: small objects with ``create / add / merge / result``.

Accumulators must be plain data (numbers, strings, lists, dicts) because they are checkpointed with
msgpack. ``merge`` is what session windows use when a record bridges two sessions and what the
two-phase (partial then final) aggregation for hot keys uses in its second phase.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Aggregate", "Aggregator", "Count", "Max", "Mean", "Min", "Reduce", "Sum", "field_getter"]

Field = str | Callable[[Any], Any] | None


def field_getter(field: Field) -> Callable[[Any], Any]:
    """``"temp"`` → ``v["temp"]``; a callable is used as is; None → the value itself."""
    if field is None:
        return lambda v: v
    if callable(field):
        return field
    return operator.itemgetter(field)


class Aggregator(Protocol):
    def create(self) -> Any: ...
    def add(self, acc: Any, value: Any) -> Any: ...
    def merge(self, a: Any, b: Any) -> Any: ...
    def result(self, acc: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class Count:
    def create(self) -> int:
        return 0

    def add(self, acc: int, value: Any) -> int:
        return acc + 1

    def merge(self, a: int, b: int) -> int:
        return a + b

    def result(self, acc: int) -> int:
        return acc


@dataclass(frozen=True)
class _OfField:
    """An aggregation over ``field_getter(field)`` of each value (``self._get``)."""

    field: Field = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "_get", field_getter(self.field))


@dataclass(frozen=True)
class Sum(_OfField):
    def create(self) -> float:
        return 0

    def add(self, acc: float, value: Any) -> float:
        return acc + self._get(value)  # type: ignore[attr-defined]

    def merge(self, a: float, b: float) -> float:
        return a + b

    def result(self, acc: float) -> float:
        return acc


@dataclass(frozen=True)
class Mean(_OfField):
    """Arithmetic mean; the accumulator is ``[sum, count]``."""

    def create(self) -> list[float]:
        return [0.0, 0]

    def add(self, acc: list[float], value: Any) -> list[float]:
        acc[0] += self._get(value)  # type: ignore[attr-defined]
        acc[1] += 1
        return acc

    def merge(self, a: list[float], b: list[float]) -> list[float]:
        return [a[0] + b[0], a[1] + b[1]]

    def result(self, acc: list[float]) -> float | None:
        return acc[0] / acc[1] if acc[1] else None


@dataclass(frozen=True)
class Min(_OfField):
    def create(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        x = self._get(value)  # type: ignore[attr-defined]
        return x if acc is None or x < acc else acc

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else min(a, b)

    def result(self, acc: Any) -> Any:
        return acc


@dataclass(frozen=True)
class Max(_OfField):
    def create(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        x = self._get(value)  # type: ignore[attr-defined]
        return x if acc is None or x > acc else acc

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else max(a, b)

    def result(self, acc: Any) -> Any:
        return acc


@dataclass(frozen=True)
class Reduce:
    """``fn(a, b) -> c`` over the values of a window (the first value starts the accumulator)."""

    fn: Callable[[Any, Any], Any]

    def create(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        return value if acc is None else self.fn(acc, value)

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else self.fn(a, b)

    def result(self, acc: Any) -> Any:
        return acc


@dataclass(frozen=True)
class Aggregate:
    """A custom aggregation from four functions (``merge`` needed for sessions and two-phase)."""

    create_fn: Callable[[], Any]
    add_fn: Callable[[Any, Any], Any]
    result_fn: Callable[[Any], Any] = lambda acc: acc
    merge_fn: Callable[[Any, Any], Any] | None = None

    def create(self) -> Any:
        return self.create_fn()

    def add(self, acc: Any, value: Any) -> Any:
        return self.add_fn(acc, value)

    def merge(self, a: Any, b: Any) -> Any:
        if self.merge_fn is None:
            from processors.errors import PipelineDefinitionError

            raise PipelineDefinitionError("this aggregation has no merge_fn (needed by session windows)")
        return self.merge_fn(a, b)

    def result(self, acc: Any) -> Any:
        return self.result_fn(acc)
