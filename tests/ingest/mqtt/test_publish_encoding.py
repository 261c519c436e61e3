"""``codec.encode_publish`` (every delivery and every journaled copy): the fixed header's remaining length
on either side of its one-byte form, with and without a packet id and properties, for 3.1.1 and 5.0;
each PUBLISH decodes back to itself."""

from __future__ import annotations

import pytest

from ingest.mqtt.codec import Decoder, encode_publish
from ingest.mqtt.packets import MQTT_5, MQTT_311, NO_PROPERTIES, Properties, Publish


@pytest.mark.parametrize("version", [MQTT_311, MQTT_5])
@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("props", [NO_PROPERTIES, Properties(message_expiry_interval=9, subscription_identifier=(4,))])
def test_publish_round_trips_around_the_one_byte_remaining_length(version: int, qos: int, props: Properties) -> None:
    v5 = version == MQTT_5
    for size in (0, 100, 114, 115, 116, 117, 118, 126, 127, 128, 129, 16_380, 16_384):
        packet = Publish("s/ü", b"p" * size, qos, True, bool(qos), 513 if qos else None, props if v5 else NO_PROPERTIES)
        wire = encode_publish(packet, v5)
        remaining = len(wire) - (2 if len(wire) - 2 < 0x80 else 3 if len(wire) - 3 < 0x4000 else 4)
        assert (wire[1] < 0x80) == (remaining < 0x80)
        decoder = Decoder(version, max_packet_size=len(wire) + 1)
        assert decoder.feed(wire) == [packet]
