"""Flow control (MQTT 5.0 §4.9): a client that exceeds the Receive Maximum gets DISCONNECT 0x93, and the
server lingers (stops writing, keeps reading and discarding) so the client reads it rather than a reset."""

from __future__ import annotations

from ingest.mqtt.codec import encode
from ingest.mqtt.packets import MQTT_5, Publish
from tests.ingest.conftest import SlowLogStore
from tests.ingest.mqtt.conftest import RawClient, StartServer


async def test_receive_maximum_exceeded_is_read_by_a_client_still_sending(start_server: StartServer) -> None:
    server = await start_server(store=SlowLogStore(0.5), receive_maximum=4)
    raw = await RawClient.open(server.port, MQTT_5)
    ack = await raw.connect("flooder")
    assert ack.properties.receive_maximum == 4
    publishes = b"".join(encode(Publish("f", b"x", 1, packet_id=i), MQTT_5) for i in range(1, 8))
    raw.send_raw(publishes + b"\xc0\x00" * 1_000_000)  # and it goes on sending: 2 MB of PINGREQs
    data = await raw.read_until_closed(timeout=10)
    # Exactly the DISCONNECT (no PINGRESP, nothing else written after it), then a clean close (EOF).
    assert data[:3] == b"\xe0" + bytes([data[1]]) + b"\x93", data[:16]
    assert len(data) == 2 + data[1]
    assert raw.reader.at_eof()
    assert server.hub.stats.protocol_errors == 1
