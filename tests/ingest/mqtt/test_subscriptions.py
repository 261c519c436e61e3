"""Topic filters and the subscription trie (MQTT 5.0 §4.7), checked against the brute-force matcher."""

from __future__ import annotations

import itertools

import pytest

from ingest.mqtt.packets import Publish
from ingest.mqtt.subscriptions import RetainedStore, SubscriptionTree, topic_matches, valid_filter, valid_topic


@pytest.mark.parametrize(
    ("topic_filter", "topic", "match"),
    [
        ("sport/tennis/player1/#", "sport/tennis/player1", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
        ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
        ("sport/#", "sport", True),
        ("sport/tennis/+", "sport/tennis/player1", True),
        ("sport/tennis/+", "sport/tennis/player1/ranking", False),
        ("sport/+", "sport", False),
        ("sport/+", "sport/", True),
        ("+/+", "/finance", True),
        ("/+", "/finance", True),
        ("+", "/finance", False),
        ("#", "$SYS/broker", False),
        ("+/monitor/Clients", "$SYS/monitor/Clients", False),
        ("$SYS/#", "$SYS/broker", True),
        ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
        ("a/b", "a/b", True),
        ("a/b", "a/B", False),
    ],
)
def test_spec_examples(topic_filter: str, topic: str, match: bool) -> None:
    assert topic_matches(topic_filter, topic) is match
    tree: SubscriptionTree[str, int] = SubscriptionTree()
    tree.add(topic_filter, "s", 1)
    assert (tree.match(topic) == [("s", 1)]) is match


def test_validation() -> None:
    assert all(valid_filter(f) for f in ("#", "+", "a/#", "a/+/b", "+/+", "/", "a//b"))
    assert not any(valid_filter(f) for f in ("", "a/#/b", "a#", "a/b+", "#/a", "a/+b"))
    assert valid_topic("a/b") and not valid_topic("a/+") and not valid_topic("a/#") and not valid_topic("")


def test_trie_agrees_with_brute_force_and_prunes() -> None:
    levels = ["a", "b", "+", "#", ""]
    filters = sorted({"/".join(p) for n in (1, 2, 3) for p in itertools.product(levels, repeat=n)
                      if valid_filter("/".join(p))})
    topics = ["/".join(p) for n in (1, 2, 3, 4) for p in itertools.product(["a", "b", ""], repeat=n)]
    tree: SubscriptionTree[str, str] = SubscriptionTree()
    for f in filters:
        assert tree.add(f, f, f)
    assert not tree.add(filters[0], filters[0], "again")  # same subscriber, same filter: replaced
    tree.add(filters[0], filters[0], filters[0])
    assert len(tree) == len(filters)
    for topic in topics:
        assert sorted(s for s, _ in tree.match(topic)) == sorted(f for f in filters if topic_matches(f, topic))
    for f in filters:
        assert tree.remove(f, f)
    assert not tree.remove("a/b", "a/b")
    assert len(tree) == 0 and tree._root.children == {}


def test_retained_store() -> None:
    store = RetainedStore()
    store.store(Publish("cmd/a/set", b"1", 1, True))
    store.store(Publish("cmd/b/set", b"2", 0, True))
    store.store(Publish("cmd/b/set", b"3", 0, True))
    assert sorted(m.payload for m, _ in store.matching("cmd/+/set", 0.0)) == [b"1", b"3"]
    assert [m.payload for m, _ in store.matching("cmd/a/set", 0.0)] == [b"1"]
    store.store(Publish("cmd/a/set", b"", 0, True))  # empty retained payload deletes
    assert [m.payload for m, _ in store.matching("#", 0.0)] == [b"3"]


def test_retained_store_drops_expired_messages() -> None:
    store = RetainedStore()
    store.store(Publish("t/short", b"1", 0, True), expiry=10.0)
    store.store(Publish("t/long", b"2", 0, True), expiry=100.0)
    store.store(Publish("t/never", b"3", 0, True))
    assert sorted(m.payload for m, _ in store.matching("t/#", 9.0)) == [b"1", b"2", b"3"]
    assert sorted(m.payload for m, _ in store.matching("t/#", 10.0)) == [b"2", b"3"]
    assert len(store) == 2 and store.get("t/short") is None
    assert store.drop_expired(100.0) == 1 and store.get("t/never") is not None
