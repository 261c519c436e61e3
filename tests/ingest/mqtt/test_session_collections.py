"""A session's subscriptions, outbound messages in flight and packet-id sets start as one shared empty
collection (``session_state.NONE_YET``, so idle connections hold none of them): it refuses to grow, and
what is added to one session's is never seen by another."""

from __future__ import annotations

import pytest

from ingest.mqtt.hub import Hub
from ingest.mqtt.packets import Publish, Subscription
from ingest.mqtt.session_state import NONE_YET, SessionState
from tests.ingest.mqtt.test_machine import NullPort


def test_the_shared_empty_collection_refuses_to_grow() -> None:
    with pytest.raises(TypeError):
        NONE_YET[1] = None
    with pytest.raises(TypeError):
        NONE_YET.add(1)
    with pytest.raises(TypeError):
        NONE_YET.setdefault(1, None)
    with pytest.raises(TypeError):
        NONE_YET.update({1: None})
    assert NONE_YET.pop(1, None) is None and len(NONE_YET) == 0  # reading and removing work as on {}


def test_what_one_session_adds_is_its_own() -> None:
    first, second = SessionState("first"), SessionState("second")
    assert first.subscriptions is NONE_YET and first.inflight_out is NONE_YET
    first.add_inflight(1, Publish("t", b"x", 1, packet_id=1))
    first.add_awaiting_rel(2)
    assert dict(first.inflight_out) == {1: Publish("t", b"x", 1, packet_id=1)} and 2 in first.awaiting_rel
    assert second.inflight_out is NONE_YET and second.awaiting_rel is NONE_YET and len(NONE_YET) == 0
    first.acked(1)
    assert first.inflight_out == {}


def test_hub_subscribe_gives_the_session_its_own_subscriptions() -> None:
    hub = Hub(NullPort())
    first, second = SessionState("first"), SessionState("second")
    hub.subscribe(first, Subscription("a/#", 1))
    assert list(first.subscriptions) == ["a/#"] and second.subscriptions is NONE_YET and len(NONE_YET) == 0
