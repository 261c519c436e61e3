"""Server→client topic aliases (MQTT 5.0 §3.3.2.3.4), per connection.

Rules
-----
1. Only when the client's CONNECT set a Topic Alias Maximum > 0; aliases never outlive the connection
   (messages re-sent after a reconnect are aliased afresh).
2. A topic's first PUBLISH carries its full name and a new alias (1, 2, … up to the client's maximum);
   later PUBLISHes to it carry the alias and an empty topic name.
3. Once the client's maximum is in use, other topics go out with their full name and no alias (aliases
   are never reassigned, so a client can never confuse two topics).
"""

from __future__ import annotations

from dataclasses import replace

from ingest.mqtt.packets import Publish

__all__ = ["OutboundAliases"]


class OutboundAliases:
    __slots__ = ("_by_topic", "maximum")

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self._by_topic: dict[str, int] = {}

    @property
    def assigned(self) -> dict[str, int]:
        return dict(self._by_topic)

    def apply(self, packet: Publish) -> Publish:
        """``packet`` as it goes on the wire (rules 2 and 3)."""
        alias = self._by_topic.get(packet.topic)
        if alias is not None:
            return replace(packet, topic="", properties=replace(packet.properties, topic_alias=alias))
        if len(self._by_topic) >= self.maximum:
            return packet
        alias = self._by_topic[packet.topic] = len(self._by_topic) + 1
        return replace(packet, properties=replace(packet.properties, topic_alias=alias))

    def forget(self, topic: str) -> None:
        """The PUBLISH that was to introduce ``topic``'s alias was not sent (too large for the client): the
        next one introduces it again. Only the latest alias is ever forgotten, so numbers stay dense."""
        if self._by_topic.get(topic) == len(self._by_topic):
            del self._by_topic[topic]
