"""Which log topics a device's MQTT topic (or topic filter) leads to through the ingest routes, so that the
ACLs of those log topics decide what an MQTT client may publish and subscribe to. Pure functions.

Rules:
- A PUBLISH to topic name ``t`` may be written to the log topic of every rule that could apply to it: the
  configured rules whose filter matches ``t`` up to the first that always applies (no ``continue``, no
  ``when_field``), and the defaults only when none of those always applies (``SourceRoutes.rules_for``).
  A rule's ``{n}`` template is resolved with ``t``'s levels. Which one applies may depend on the payload
  (``when_field``), so every candidate counts.
- A SUBSCRIBE to filter ``f`` receives what is published on the topic names ``f`` matches: the rules whose
  filter can match one of those names (an overlap of two filters), configured then default, up to the
  first that always applies to every one of those names (its filter covers ``f``). A
  template is resolved when every level it uses is a literal in ``f``; otherwise the log topic is not
  known in advance and ``None`` stands for "any topic" (the caller then needs a grant on every topic).
- A shared subscription (``$share/<group>/<filter>``) is judged by its filter.
- A TCP line has no topic name: the rules without a filter apply (``publish_topics(routes, None)``), and a
  line may go to any of them (``when_field`` depends on the payload).
"""

from __future__ import annotations

import re

from ingest.router import SourceRoutes
from ingest.routing import RouteRule

__all__ = ["filters_overlap", "publish_topics", "subscribe_topics"]

_FIELD = re.compile(r"\{(\d+)\}")


def publish_topics(routes: SourceRoutes, topic: str | None) -> set[str]:
    """The log topics a PUBLISH to ``topic`` (None: a line of a source without topics, TCP) may be written
    to (a template that cannot be resolved is left out: such a message goes to the dead letters)."""
    configured, defaults = routes.rules_for(topic)
    chosen = list(configured)
    if not configured or not _always(configured[-1]):
        chosen += defaults
    levels = (topic or "").split("/")
    out = set()
    for rule in chosen:
        name = _resolve(rule.topic, levels)
        if name is not None:
            out.add(name)
    return out


def subscribe_topics(rules: list[RouteRule], defaults: tuple[RouteRule, ...], topic_filter: str) -> set[str | None]:
    """The log topics whose records a subscription to ``topic_filter`` may receive; ``None``: not known."""
    inner = topic_filter
    if inner.startswith("$share/"):
        inner = inner.split("/", 2)[2] if inner.count("/") >= 2 else ""
    levels = inner.split("/")
    out: set[str | None] = set()
    for rule in (*rules, *defaults):
        if rule.filter is not None and not filters_overlap(rule.filter, inner):
            continue
        out.add(_resolve(rule.topic, levels, wildcards_unknown=True))
        if _always(rule) and (rule.filter is None or _covers(rule.filter, inner)):
            break  # no later rule sees these topics
    return out


def filters_overlap(a: str, b: str) -> bool:
    """Whether some topic name matches both MQTT filters ``a`` and ``b``."""
    left, right = a.split("/"), b.split("/")
    for i in range(max(len(left), len(right))):
        x = left[i] if i < len(left) else None
        y = right[i] if i < len(right) else None
        if x == "#" or y == "#":
            return True
        if x is None or y is None:
            return False
        if x != "+" and y != "+" and x != y:
            return False
    return True


def _covers(outer: str, inner: str) -> bool:
    """Whether every topic name matching filter ``inner`` also matches filter ``outer``."""
    big, small = outer.split("/"), inner.split("/")
    for i, level in enumerate(big):
        if level == "#":
            return True
        if i >= len(small) or small[i] == "#":
            return False
        if level != "+" and (small[i] == "+" or small[i] != level):
            return False
    return len(small) == len(big)


def _always(rule: RouteRule) -> bool:
    return not rule.fan_out and rule.when_field is None


def _resolve(template: str, levels: list[str], *, wildcards_unknown: bool = False) -> str | None:
    if "{" not in template:
        return template
    used = [int(n) for n in _FIELD.findall(template)]
    if any(n >= len(levels) or (wildcards_unknown and levels[n] in ("+", "#")) for n in used):
        return None
    if wildcards_unknown and "#" in levels[: max(used, default=0) + 1]:
        return None
    try:
        return template.format(*levels)
    except (IndexError, KeyError, ValueError):
        return None
