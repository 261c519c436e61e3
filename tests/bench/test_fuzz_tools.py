"""The fuzz harness's own logic: deterministic mutations, framing checks, log scanning and signatures."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

import pytest

from bench.fuzz.harness import BrokerProcess, signature
from bench.fuzz.kafka import load_captured, split_frames
from bench.fuzz.mqtt import MAX_PACKET, connect, encode_varint, packet_state
from bench.fuzz.mutate import mutate


def test_mutations_are_a_function_of_the_seed() -> None:
    data = bytes(range(64))
    first = [mutate(data, random.Random(s), [data]) for s in range(50)]
    again = [mutate(data, random.Random(s), [data]) for s in range(50)]
    assert first == again
    assert sum(m != data for m in first) > 40


def test_kafka_framing_states() -> None:
    frame = (4).to_bytes(4, "big") + b"abcd"
    assert split_frames(frame * 2) == ([frame, frame], "whole")
    assert split_frames(frame + frame[:6]) == ([frame], "incomplete")
    assert split_frames((-1).to_bytes(4, "big", signed=True))[1] == "bad-length"
    assert split_frames((200 * 1024 * 1024).to_bytes(4, "big") + b"x")[1] == "bad-length"


def test_captured_kafka_corpus_is_whole_frames_from_several_apis() -> None:
    frames = load_captured()
    assert len(frames) > 50
    assert all(split_frames(f)[1] == "whole" for f in frames)
    assert len({int.from_bytes(f[4:6], "big") for f in frames}) >= 15  # API keys seen from real clients


def test_mqtt_framing_states() -> None:
    packet = connect(random.Random(1), 5)
    assert packet_state(packet) == "whole"
    assert packet_state(packet[:-1]) == "incomplete"
    assert packet_state(b"\x30" + encode_varint(MAX_PACKET + 1)) == "bad-length"
    assert packet_state(b"\x30\xff\xff\xff\xff\x01") == "bad-length"


def test_websocket_frames_parse_with_the_websockets_library_and_their_states() -> None:
    """The mqtt-ws door's frame encoder (written from RFC 6455) against the websockets library's parser; the
    states that decide whether the door sends its sentinel or ends the connection with EOF."""
    from websockets.frames import Frame, Opcode
    from websockets.streams import StreamReader

    from bench.fuzz.mqtt_ws import BINARY, CONT, frames_state, ws_frame

    rng = random.Random(3)
    packet = connect(rng, 4)
    frames = ws_frame(BINARY, packet[:5], rng, fin=False) + ws_frame(CONT, packet[5:], rng)
    reader = StreamReader()
    reader.feed_data(frames + ws_frame(BINARY, b"x" * 70000, rng))
    parsed = []
    for _ in range(3):
        parser = Frame.parse(reader.read_exact, mask=True)
        try:
            next(parser)
        except StopIteration as done:
            parsed.append(done.value)
    assert [(f.opcode, f.fin) for f in parsed] == [(Opcode.BINARY, False), (Opcode.CONT, True), (Opcode.BINARY, True)]
    assert parsed[0].data + parsed[1].data == packet and len(parsed[2].data) == 70000
    assert frames_state(frames) == "whole"
    assert frames_state(frames[:-1]) == "incomplete"  # a frame cut short
    assert frames_state(ws_frame(BINARY, packet[:-1], rng)) == "incomplete"  # a whole frame, the packet cut short
    assert frames_state(ws_frame(BINARY, b"", rng, length=1 << 40)) == "broken"


def test_log_scan_takes_error_records_whole_and_waits_for_unfinished_tracebacks(tmp_path: Path) -> None:
    broker = BrokerProcess({}, tmp_path)
    log = broker.log_path
    log.write_text(
        "2026-01-01 00:00:00,000 INFO    a: fine\n"
        "2026-01-01 00:00:00,001 ERROR   b: boom x=1\nTraceback (most recent call last):\n"
        '  File "/x/y.py", line 3, in f\n'
    )
    assert broker.new_log_findings() == []  # the traceback has no exception line yet
    with log.open("a") as f:
        f.write("ValueError: bad\n2026-01-01 00:00:00,002 WARNING c: careful\n")
    (found,) = broker.new_log_findings()
    assert found.startswith("2026-01-01 00:00:00,001 ERROR   b: boom") and found.endswith("ValueError: bad\n")
    assert signature("traceback", found) == "traceback: ValueError: bad at y.py:3 f"
    assert broker.new_log_findings() == []


def test_in_process_harnesses_keep_their_contract_on_the_seed_inputs() -> None:
    """The atheris harnesses (bench.fuzz.inprocess) run here without atheris, over well-formed and mutated
    seeds: only each decoder's own error types may escape."""
    from bench.fuzz.inprocess import HARNESSES
    from bench.fuzz.mqtt import publish, subscribe
    from bench.fuzz.tcp import hostile_line, valid_line

    rng = random.Random(3)
    kafka = [f[4:] for f in load_captured()]
    mqtt = [b"\x00" + connect(rng, 4), b"\x02" + publish(rng, 5), b"\x01" + subscribe(rng, 4)]
    lines = [bytes((i,)) + f(rng, fmt) for i, fmt in enumerate(("ndjson", "influx", "csv"))
             for f in (valid_line, hostile_line)]
    for name, seeds in (("kafka-codec", kafka), ("mqtt-codec", mqtt), ("ingest-formats", lines)):
        one = HARNESSES[name]()
        for seed in seeds:
            for _ in range(20):
                one(mutate(seed, rng, seeds))


def test_a_server_that_reads_and_never_answers_is_reported_as_a_hang() -> None:
    import socket
    import threading
    from types import SimpleNamespace

    import pytest

    from bench.fuzz.harness import Hang
    from bench.fuzz.kafka import KafkaTarget

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept_and_ignore() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)  # read nothing, answer nothing, never close

    threading.Thread(target=accept_and_ignore, daemon=True).start()
    target = KafkaTarget(deadline=0.3)
    target.broker = SimpleNamespace(endpoints={"kafka": listener.getsockname()})  # type: ignore[assignment]
    target.seeds = load_captured()
    rng = random.Random(1)
    try:
        with pytest.raises(Hang):
            for _ in range(200):  # pipelined inputs are judged at their sentinel, at most 16 later
                target.step(rng)
    finally:
        target.close_all()
        listener.close()
        for conn in held:
            conn.close()


def _serve_produce_and_fetch(listener: socket.socket, corrupt: bool) -> None:
    """A stand-in log behind the Kafka codec: stores each produced batch, answers Fetch with them; with
    ``corrupt`` the last byte of every stored batch is flipped (what a reused request buffer would do)."""
    from broker.protocol.kafka import ApiKey, FrameDecoder, decode_request, encode_response
    from broker.protocol.kafka.fetch import FetchPartitionResponse, FetchResponse, FetchTopicResponse
    from broker.protocol.kafka.produce import ProducePartitionResponse, ProduceResponse, ProduceTopicResponse

    stored: list[bytes] = []
    next_offset = 0

    def serve(conn: socket.socket) -> None:
        nonlocal next_offset
        with conn:
            decoder = FrameDecoder()
            while chunk := conn.recv(1 << 20):
                for frame in decoder.feed(chunk):
                    request = decode_request(frame)
                    if request.header.api_key == ApiKey.PRODUCE:
                        topic = request.body.topic_data[0]
                        batch = bytearray(topic.partition_data[0].records)
                        batch[:8] = next_offset.to_bytes(8, "big")
                        batch[-1] ^= 0xFF if corrupt else 0
                        stored.append(bytes(batch))
                        part = ProducePartitionResponse(0, 0, next_offset)
                        next_offset += int.from_bytes(batch[23:27], "big") + 1
                        body: object = ProduceResponse((ProduceTopicResponse(topic.name, (part,)),))
                    elif request.header.api_key == ApiKey.FETCH:
                        topic = request.body.topics[0]
                        start = topic.partitions[0].fetch_offset
                        records = b"".join(b for b in stored if int.from_bytes(b[:8], "big") >= start)
                        fetched = FetchPartitionResponse(0, 0, next_offset, next_offset, 0, records)
                        body = FetchResponse((FetchTopicResponse(topic.topic, (fetched,)),))
                    else:
                        continue  # the mixed-in requests: no answer needed by the verifier
                    conn.sendall(encode_response(request.header, body))

    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


@pytest.mark.parametrize("corrupt", [False, True])
def test_the_kafka_verifier_reads_acknowledged_batches_back_and_reports_a_changed_byte(corrupt: bool) -> None:
    from bench.fuzz.harness import Mismatch
    from bench.fuzz.kafka_verify import verified_pipeline

    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_serve_produce_and_fetch, args=(listener, corrupt), daemon=True).start()

    def connect() -> socket.socket:
        return socket.create_connection(listener.getsockname(), timeout=10)

    try:
        with connect() as sock:
            if corrupt:
                with pytest.raises(Mismatch, match="reads back different"):
                    verified_pipeline(sock, connect, "verify-t", [], random.Random(3), 10.0)
            else:
                assert verified_pipeline(sock, connect, "verify-t", [], random.Random(3), 10.0) > 0
    finally:
        listener.close()
