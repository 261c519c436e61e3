"""fast_frozen_init changes how fast a frozen dataclass is built, nothing else."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest.fastinit import fast_frozen_init
from ingest.mqtt.packets import Properties, Publish
from ingest.routing import RawMessage


@dataclasses.dataclass(frozen=True, slots=True)
class Plain:
    a: bytes
    b: str | None = None
    c: int = -1


@fast_frozen_init
@dataclasses.dataclass(frozen=True, slots=True)
class Fast:
    a: bytes
    b: str | None = None
    c: int = -1


def _params(cls: type) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(cls).parameters.values()]


@given(a=st.binary(max_size=8), b=st.none() | st.text(max_size=5), c=st.integers(), use_kw=st.booleans())
def test_same_values_equality_hash_and_repr(a: bytes, b: str | None, c: int, use_kw: bool) -> None:
    plain, fast = (cls(a=a, b=b, c=c) if use_kw else cls(a, b, c) for cls in (Plain, Fast))
    assert dataclasses.astuple(plain) == dataclasses.astuple(fast)
    assert hash(plain) == hash(fast)
    assert repr(plain).replace("Plain", "Fast") == repr(fast)
    assert fast == Fast(a, b, c) and fast != Fast(a + b"!", b, c)
    assert dataclasses.replace(fast, c=c + 1).c == c + 1


def test_defaults_signature_frozenness_and_errors() -> None:
    assert _params(Plain) == _params(Fast)
    assert Fast(b"x") == Fast(b"x", None, -1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Fast(b"x").a = b"y"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Fast()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Fast(b"x", d=1)  # type: ignore[call-arg]


def test_the_hot_path_classes_keep_their_fields() -> None:
    msg = RawMessage(b"p", "a/b", "dev", 5)
    assert (msg.payload, msg.subject, msg.device, msg.arrival_ms, msg.columns) == (b"p", "a/b", "dev", 5, None)
    pub = Publish("t", b"x", 1, packet_id=7)
    assert (pub.topic, pub.payload, pub.qos, pub.retain, pub.dup, pub.packet_id) == ("t", b"x", 1, False, False, 7)
    assert isinstance(pub.properties, Properties)
    assert Publish("t") == Publish("t", b"", 0, False, False, None)


def test_unsupported_classes_are_refused_up_front() -> None:
    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True)
    class PostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (NotFrozen, Factory, PostInit):
        with pytest.raises(TypeError):
            fast_frozen_init(cls)
