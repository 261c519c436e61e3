"""``ConnectionMachine._plain_publishes`` (the short loop for runs of QoS 0/1 PUBLISHes without properties
when there are no ACLs) decides exactly as ``_on_publish`` does.

The same client script runs against two hubs: one without ACLs (the short loop takes what it can) and one
whose ACLs allow everything (every PUBLISH goes through ``_on_publish``). Reads hold several packets, so
runs start and stop on every kind of packet the loop hands back: QoS 2, properties and topic aliases
(rule 6), invalid topic names, retries of ids still being appended (rule 4), Receive Maximum exceeded
(rule 5, with a small maximum). The bytes written, what is stored and how the connection ends must agree.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.mqtt.codec import encode
from ingest.mqtt.hub import Hub, HubConfig
from ingest.mqtt.packets import MQTT_5, MQTT_311, Connect, Pingreq, Properties, Publish, Pubrel
from tests.ingest.mqtt.test_machine import Harness, NullPort


class AllowAll:
    def may_publish(self, username: str | None, peer: str, topic: str) -> bool:
        return True

    def may_subscribe(self, username: str | None, peer: str, topic_filter: str) -> bool:
        return True


def _publish(qos: int, pid: int, topic: str, props: Properties | None) -> Publish:
    return Publish(topic, b"p-" + topic.encode(), qos, False, False, pid if qos else None, props or Properties())


plain = st.builds(_publish, st.sampled_from([0, 1, 1, 1]), st.integers(1, 8), st.sampled_from(["a/1", "a/2", "b"]),
                  st.none())
other = st.one_of(  # what the short loop hands to _on_publish and the connection survives
    st.builds(_publish, st.just(2), st.integers(1, 8), st.just("a/1"), st.none()),
    st.builds(_publish, st.integers(0, 2), st.integers(1, 8), st.sampled_from(["a/1", "c"]),
              st.sampled_from([Properties(topic_alias=1), Properties(topic_alias=2), Properties(content_type="t")])),
    st.builds(_publish, st.integers(0, 1), st.integers(1, 8), st.just(""), st.just(Properties(topic_alias=1))),
)
fatal = st.one_of(  # ... and the ones that end it (invalid topic names, alias out of range)
    st.builds(_publish, st.integers(0, 1), st.integers(1, 8), st.sampled_from(["", "a/+", "x/#"]), st.none()),
    st.builds(_publish, st.integers(0, 1), st.integers(1, 8), st.just("a/1"), st.just(Properties(topic_alias=40))),
)
# a read: a run of plain PUBLISHes, maybe packets of other kinds (an alias set, then used), another run
interrupt = st.one_of(
    st.lists(other, min_size=1, max_size=2), st.lists(fatal, max_size=1),
    st.builds(lambda qos, pid: [_publish(qos, pid, "a/2", Properties(topic_alias=2)),
                                _publish(qos, pid % 8 + 1, "", Properties(topic_alias=2))],
              st.integers(0, 1), st.integers(1, 8)),
    st.lists(st.one_of(st.just(Pingreq()), st.builds(Pubrel, st.integers(1, 8))), max_size=1),
)
one_read = st.builds(lambda a, b, c: a + b + c, st.lists(plain, max_size=8), interrupt, st.lists(plain, max_size=8))
reads = st.lists(st.one_of(one_read, st.just("append")), max_size=10)


def _run(hub: Hub, version: int, script: list[Any]) -> Harness:
    h = Harness(hub)
    h.feed(encode(Connect("c", version), version))
    for step in script:
        if step == "append":
            h.complete_appends()
        else:
            h.feed(b"".join(encode(p, version) for p in step))
    h.complete_appends()
    return h


@settings(max_examples=200, deadline=None)
@given(version=st.sampled_from([MQTT_311, MQTT_5]), receive_maximum=st.sampled_from([3, 1024]), script=reads)
def test_the_short_loop_decides_as_on_publish(version: int, receive_maximum: int, script: list[Any]) -> None:
    config = HubConfig(receive_maximum=receive_maximum)
    short = _run(Hub(NullPort(), config), version, script)
    general = _run(Hub(NullPort(), config, access=AllowAll()), version, script)
    assert bytes(short.wire) == bytes(general.wire)
    assert short.stored == general.stored
    assert (short.closed, short.lingering, short.machine.state) == (
        general.closed, general.lingering, general.machine.state)
    assert short.machine.hub.stats == general.machine.hub.stats
