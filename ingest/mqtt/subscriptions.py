"""Topic filters: validation, a subscription trie keyed by topic level, and the retained-message store.

Matching rules (MQTT 5.0 §4.7): levels are separated by ``/``; ``+`` matches exactly one level; ``#`` is
the last level of a filter and matches the parent level and any number of children (``a/#`` matches
``a``); filters starting with a wildcard do not match topics starting with ``$``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

from ingest.mqtt.packets import Publish

__all__ = ["RetainedStore", "SubscriptionTree", "filter_error", "topic_matches", "valid_filter", "valid_topic"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def valid_topic(topic: str) -> bool:
    """A topic name to publish to: non-empty, no wildcards."""
    return bool(topic) and "+" not in topic and "#" not in topic


def filter_error(topic_filter: str) -> str | None:
    """Why ``topic_filter`` is not a valid topic filter (non-empty; ``#`` only as the whole last level;
    ``+`` only as a whole level), or None when it is one."""
    if not topic_filter:
        return "topic filter is empty"
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return f"topic filter {topic_filter!r}: '#' must be the whole last level"
        if "+" in level and level != "+":
            return f"topic filter {topic_filter!r}: '+' must be a whole level"
    return None


def valid_filter(topic_filter: str) -> bool:
    return filter_error(topic_filter) is None


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether a topic name matches a (valid) filter."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    for i, f in enumerate(f_levels):
        if f == "#":
            return True
        if i >= len(t_levels):
            return False
        if f != "+" and f != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)


class _Node(Generic[K, V]):
    __slots__ = ("children", "subscribers")

    def __init__(self) -> None:
        self.children: dict[str, _Node[K, V]] = {}
        self.subscribers: dict[K, V] = {}


class SubscriptionTree(Generic[K, V]):
    """Filter → {subscriber: value}; ``match(topic)`` finds every subscriber whose filter matches."""

    __slots__ = ("_count", "_root")

    def __init__(self) -> None:
        self._root: _Node[K, V] = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, topic_filter: str, subscriber: K, value: V) -> bool:
        """Subscribe; returns True when this subscriber had no subscription to this exact filter."""
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        new = subscriber not in node.subscribers
        node.subscribers[subscriber] = value
        self._count += new
        return new

    def remove(self, topic_filter: str, subscriber: K) -> bool:
        path: list[tuple[_Node[K, V], str]] = []
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if node.subscribers.pop(subscriber, None) is None:
            return False
        self._count -= 1
        for parent, level in reversed(path):  # prune empty branches
            child = parent.children[level]
            if child.subscribers or child.children:
                break
            del parent.children[level]
        return True

    def match(self, topic: str) -> list[tuple[K, V]]:
        """Every (subscriber, value) whose filter matches ``topic``; a subscriber appears once per filter."""
        out: list[tuple[K, V]] = []
        levels = topic.split("/")
        dollar = topic.startswith("$")
        self._walk(self._root, levels, 0, dollar, out)
        return out

    def _walk(self, node: _Node[K, V], levels: list[str], i: int, dollar: bool, out: list[tuple[K, V]]) -> None:
        children = node.children
        wild_ok = not (dollar and i == 0)
        if wild_ok:
            hash_node = children.get("#")
            if hash_node is not None:
                out.extend(hash_node.subscribers.items())
        if i == len(levels):
            out.extend(node.subscribers.items())
            return
        exact = children.get(levels[i])
        if exact is not None:
            self._walk(exact, levels, i + 1, dollar, out)
        if wild_ok:
            plus = children.get("+")
            if plus is not None:
                self._walk(plus, levels, i + 1, dollar, out)


class RetainedStore:
    """The last retained PUBLISH per topic with when it expires (monotonic, None: never); an empty
    retained payload deletes (§3.3.1.3); an expired message is dropped, never handed out."""

    __slots__ = ("_messages",)

    def __init__(self) -> None:
        self._messages: dict[str, tuple[Publish, float | None]] = {}

    def __len__(self) -> int:
        return len(self._messages)

    def store(self, message: Publish, expiry: float | None = None) -> None:
        if message.payload:
            self._messages[message.topic] = (message, expiry)
            self.changed(message.topic, message, expiry)
        elif self._messages.pop(message.topic, None) is not None:
            self.changed(message.topic, None, None)

    def changed(self, topic: str, message: Publish | None, expiry: float | None) -> None:
        """Called after the message of ``topic`` was set (None: deleted or expired); for a durable store."""

    def get(self, topic: str) -> Publish | None:
        found = self._messages.get(topic)
        return None if found is None else found[0]

    def matching(self, topic_filter: str, now: float) -> Iterator[tuple[Publish, float | None]]:
        """(message, expiry) of every unexpired retained message whose topic matches ``topic_filter``."""
        if "+" not in topic_filter and "#" not in topic_filter:
            candidates = [topic_filter] if topic_filter in self._messages else []
        else:
            candidates = [t for t in self._messages if topic_matches(topic_filter, t)]
        for topic in candidates:
            found = self._messages.get(topic)
            if found is None:
                continue
            if found[1] is not None and found[1] <= now:
                del self._messages[topic]
                self.changed(topic, None, None)
                continue
            yield found

    def drop_expired(self, now: float) -> int:
        """Remove every expired message; returns how many."""
        expired = [t for t, (_, expiry) in self._messages.items() if expiry is not None and expiry <= now]
        for topic in expired:
            del self._messages[topic]
            self.changed(topic, None, None)
        return len(expired)
